"""TFRecord shards without TensorFlow: index, random access, copy, write, and the
tf.train.Example records in them (encode_example, parse_example: protobuf's wire format in
plain Python), so that a node with PyTorch alone reads and writes the same files.

A TFRecord file is a sequence of framed records:

    uint64 length | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC of data

(little-endian). `scan` walks a file reading only the 12-byte headers and seeking over
the payloads, so indexing ImageNet's 1.28 M training records reads ~15 MB, not 140 GB.
The index keeps, per record, the shard number, the data's byte offset and its length:
16 bytes a record (uint32 + int64 + uint32), ~20 MB at 1.28 M records. A record is then
one `os.pread` at its offset. `copy_records` copies whole framed records (header and
CRCs included) byte for byte, so a copy needs no CRC computation and no re-encoding.

Length headers are checked against their CRC (vectorised in numpy, so the check costs
little); payload CRCs are not checked here (that would read every byte): a damaged
payload surfaces when the record is parsed.

GZIP-compressed files (TFRecordWriter's "GZIP" option, as MLPerf HPC's CosmoFlow set is
written) are told by their first bytes (`is_gzip`); a gzip stream has no random
access, so their index's offsets are into the decompressed stream (`scan_stream`), and
the Reader decompresses a file whole to read a record of it (keeping the last one).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from harness.files import atomic_path
from harness.workloads import DataError

HEADER, FOOTER = 12, 4
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> np.ndarray:
    poly, table = 0x82F63B78, np.zeros(256, np.uint32)  # Castagnoli, reflected
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _crc32c_table()


def masked_crc32c(rows: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC-32C of each row of a (n, k) uint8 array: (n,) uint32 (one
    numpy step a column: for many short rows, the length headers)."""
    crc = np.full(len(rows), 0xFFFFFFFF, np.uint32)
    for j in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    return _mask(crc ^ np.uint32(0xFFFFFFFF))


def _mask(crc):
    """TFRecord's mask of a CRC-32C (uint32 numpy values)."""
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def masked_crc32c_of(data: bytes) -> int:
    """The masked CRC-32C of one payload: the `crc32c` package's (hardware CRC, 80 kB
    wheel, requirements.txt) where installed, else the numpy table byte by byte (right,
    but ~1 s a megabyte)."""
    try:
        from crc32c import crc32c
    except ImportError:
        return int(masked_crc32c(np.frombuffer(data, np.uint8)[None, :])[0])
    return int(_mask(np.array([crc32c(data)], np.uint32))[0])   # an array: uint32 arithmetic wraps silently


def frame(data: bytes) -> bytes:
    """One framed record: length, its masked CRC, the data, its masked CRC."""
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c_of(head)) + data + struct.pack("<I", masked_crc32c_of(data))


@dataclass(frozen=True)
class Index:
    """Where every record of a list of shards is: record k is files[shard[k]] at
    byte offset[k], length[k] bytes (the data, without framing)."""
    files: tuple
    shard: np.ndarray   # uint32
    offset: np.ndarray  # int64; in a GZIP file's decompressed stream
    length: np.ndarray  # uint32
    gzip: tuple = ()    # per file: GZIP-compressed (empty: none is)

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def nbytes(self) -> int:
        return self.shard.nbytes + self.offset.nbytes + self.length.nbytes


def scan(file: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of the records of one TFRecord file, from its headers only.
    Raises DataError naming the file on a truncated file or a corrupt length header."""
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError as e:
        raise DataError(f"{file}: cannot open ({e.strerror})") from None
    try:
        return _walk(lambda pos: os.pread(fd, HEADER, pos), os.fstat(fd).st_size, file)
    finally:
        os.close(fd)


def scan_stream(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`scan` over a TFRecord stream held in memory (a decompressed GZIP file, `name`):
    offsets into `data`."""
    return _walk(lambda pos: data[pos:pos + HEADER], len(data), name)


def _walk(head_at, size: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The header walk of `scan`: `head_at(pos)` gives the (up to) 12 bytes at pos of a
    stream of `size` bytes; payloads are skipped, never read."""
    offsets, headers, pos = [], bytearray(), 0
    while pos < size:
        head = head_at(pos)
        if len(head) < HEADER:
            raise DataError(f"{name}: truncated TFRecord: a {len(head)}-byte record header "
                            f"at byte {pos} (record {len(offsets)}), 12 expected")
        (length,) = struct.unpack_from("<Q", head)
        end = pos + HEADER + length + FOOTER
        if end > size or length >= 2**32:  # lengths are kept as uint32 (JPEGs are far smaller)
            raise DataError(f"{name}: truncated or corrupt TFRecord: record {len(offsets)} at "
                            f"byte {pos} claims {length} bytes, the file ends at byte {size}")
        offsets.append(pos + HEADER)
        headers += head
        pos = end
    heads = np.frombuffer(bytes(headers), np.uint8).reshape(-1, HEADER)
    stored = heads[:, 8:12].copy().view("<u4").ravel()
    bad = np.flatnonzero(masked_crc32c(heads[:, :8]) != stored)
    if len(bad):
        k = int(bad[0])
        raise DataError(f"{name}: corrupt TFRecord: the length header of record {k} at byte "
                        f"{offsets[k] - HEADER} fails its CRC ({len(bad)} bad header(s))")
    lengths = heads[:, :8].copy().view("<u8").ravel()
    return np.asarray(offsets, np.int64), lengths.astype(np.uint32)


# TensorFlow's TFRecordWriter with compression "GZIP" writes one gzip stream (RFC 1952),
# which starts with these two bytes; an uncompressed TFRecord starts with a record
# length whose CRC the walk checks. So a file's compression is read from the file.
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(file: str) -> bool:
    """Whether a TFRecord file is GZIP-compressed: its first two bytes, not its name."""
    try:
        with open(file, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError as e:
        raise DataError(f"{file}: cannot open ({e.strerror})") from None


def read_gzip(file: str) -> bytes:
    """The decompressed TFRecord stream of a GZIP file (a gzip stream has no random
    access: a record is found by decompressing the file). DataError naming the file if
    it is truncated or corrupt."""
    import gzip
    import zlib
    try:
        with gzip.open(file, "rb") as f:
            return f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{file}: truncated or corrupt GZIP TFRecord ({e})") from None
    except OSError as e:
        raise DataError(f"{file}: cannot read ({e.strerror or e})") from None


def build_index(files) -> Index:
    parts = [scan(f) for f in files]
    empty = [(np.zeros(0, np.int64), np.zeros(0, np.uint32))]  # no files: an empty index
    shard = np.concatenate([np.full(len(o), i, np.uint32) for i, (o, _) in enumerate(parts or empty)])
    offset = np.concatenate([o for o, _ in parts or empty])
    length = np.concatenate([n for _, n in parts or empty])
    return Index(tuple(files), shard, offset, length)


def cache_key(files) -> str:
    """Names, sizes and mtimes of the shards: a changed or replaced shard re-indexes.
    Base names, not paths: a directory moved or renamed into place keeps its index."""
    stats = [(os.path.basename(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    return hashlib.sha1(json.dumps(stats).encode()).hexdigest()[:20]


def save_npz(file: str, **arrays) -> None:
    """Write atomically: concurrent readers see the old file or the whole new one."""
    with atomic_path(file) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load_npz(file: str):
    """The arrays of an .npz cache, or None if there is none or it is unreadable."""
    try:
        with np.load(file) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError):
        return None


class Splits:
    """A data set whose training and validation splits are Indexes `train` and `val`
    (ic, cosmoflow): the sizes the harness reads."""
    train: Index
    val: Index

    @property
    def n_train(self) -> int:
        return len(self.train)

    @property
    def n_val(self) -> int:
        return len(self.val)


class Reader:
    """Random access to an index's records: one pread each (a GZIP shard: decompressed
    whole, the last one kept; Index.gzip). Shards are opened on first
    use and kept open, at most a quarter of the open-file limit at once (ImageNet has
    1024 training shards; a soft limit of 1024 is common), least recently used closed."""

    def __init__(self, index: Index):
        import resource
        from collections import OrderedDict
        self.index = index
        self.open_max = max(8, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)
        self._fds = OrderedDict()
        self._stream = (None, b"")   # (shard, bytes): the last GZIP file decompressed

    def fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is not None:
            self._fds.move_to_end(shard)
            return fd
        if len(self._fds) >= self.open_max:
            os.close(self._fds.popitem(last=False)[1])
        file = self.index.files[shard]
        try:
            fd = self._fds[shard] = os.open(file, os.O_RDONLY)
        except OSError as e:
            raise DataError(f"{file}: cannot open ({e.strerror})") from None
        return fd

    def record(self, k: int) -> bytes:
        return self._read(k, 0, 0)

    def framed(self, k: int) -> bytes:
        """Record k with its framing (length, CRCs), as stored: a copy needs no CRC."""
        return self._read(k, HEADER, FOOTER)

    def _read(self, k: int, before: int, after: int) -> bytes:
        i = self.index
        start, n = int(i.offset[k]) - before, int(i.length[k]) + before + after
        shard = int(i.shard[k])
        gz = bool(i.gzip and i.gzip[shard])
        if gz:   # no random access into a gzip stream: the whole file, kept
            if self._stream[0] != shard:
                self._stream = (shard, read_gzip(i.files[shard]))
            data = self._stream[1][start:start + n]
        else:
            data = os.pread(self.fd(shard), n, start)
        if len(data) != n:
            raise DataError(f"{i.files[shard]}: record at byte {int(i.offset[k])}"
                            f"{' of the decompressed stream' if gz else ''} is short ({len(data)} of {n} bytes):"
                            " the file changed after indexing")
        return data

    def records(self, ks) -> list:
        return [self.record(k) for k in ks]

    def close(self) -> None:
        self._stream = (None, b"")
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def copy_records(index: Index, rows: np.ndarray, out_file: str,
                 chunk: int = 16 << 20) -> tuple[np.ndarray, np.ndarray, int]:
    """Copy the framed records `rows` (in that order) into a new TFRecord file, byte for
    byte. Runs of records adjacent in their source shard are copied as one read.
    Returns the new file's (offsets, lengths) of the data and the bytes written."""
    rows = np.asarray(rows, np.int64)
    shard, length = index.shard[rows], index.length[rows].astype(np.int64)
    start = index.offset[rows] - HEADER
    end = index.offset[rows] + length + FOOTER
    # a new run wherever the shard changes or the next record is not the adjacent one
    brk = np.ones(len(rows), bool)
    brk[1:] = (shard[1:] != shard[:-1]) | (start[1:] != end[:-1])
    firsts = np.flatnonzero(brk)
    lasts = np.append(firsts[1:], len(rows)) - 1
    written = 0
    with Reader(index) as reader, open(out_file, "wb") as out:
        for a, b in zip(firsts, lasts):
            fd, pos, stop = reader.fd(int(shard[a])), int(start[a]), int(end[b])
            while pos < stop:
                data = os.pread(fd, min(chunk, stop - pos), pos)
                if not data:
                    raise DataError(f"{index.files[shard[a]]}: ends at byte {pos}, the index says "
                                    f"{stop}: the file changed after indexing")
                out.write(data)
                pos += len(data)
                written += len(data)
    framed = length + HEADER + FOOTER
    offsets = np.concatenate([[0], np.cumsum(framed)[:-1]]).astype(np.int64) + HEADER
    return offsets, length.astype(np.uint32), written


# ---- the ImageNet layout ------------------------------------------------------------
# As the common converter (TensorFlow models' build_imagenet_data.py) writes it: shards
# `train-00000-of-01024` ... and `validation-00000-of-00128` ..., one tf.train.Example
# a record with the JPEG bytes in `image/encoded` and the class in `image/class/label`
# (1..1000 there: 0 is kept for "background").
SPLITS = ("train", "validation")
IMAGE_KEY, LABEL_KEY = "image/encoded", "image/class/label"


def shard_name(split: str, i: int, n: int) -> str:
    return f"{split}-{i:05d}-of-{n:05d}"


def list_shards(path: str, split: str) -> list:
    """The sorted shard files of a split; DataError unless they are all there."""
    import re
    pattern = re.compile(rf"{split}-(\d{{5}})-of-(\d{{5}})\Z")
    try:
        names = sorted(n for n in os.listdir(path) if pattern.match(n))
    except OSError as e:
        raise DataError(f"{path}: cannot list the directory ({e.strerror})") from None
    if not names:
        raise DataError(f"{path}: no {split} shards (files named {shard_name(split, 0, 1024)}, ...) "
                        "in the ImageNet TFRecord layout")
    totals = {int(pattern.match(n).group(2)) for n in names}
    if len(totals) != 1 or [int(pattern.match(n).group(1)) for n in names] != list(range(totals.pop())):
        raise DataError(f"{path}: {split} shards are incomplete or inconsistent: found "
                        f"{len(names)} ({names[0]} .. {names[-1]})")
    return [os.path.join(path, n) for n in names]


def example(jpeg: bytes, label: int, height: int, width: int) -> bytes:
    """One serialized tf.train.Example with the converter's main features."""
    return encode_example({IMAGE_KEY: [jpeg], LABEL_KEY: [int(label)], "image/format": [b"JPEG"],
                           "image/height": [height], "image/width": [width], "image/channels": [3]})


def write_split(path: str, split: str, records, n: int, shards: int) -> None:
    """Write n serialized records (any iterable, consumed in order) into `shards`
    shard files of `split`, as evenly as possible."""
    it = iter(records)
    for i, size in enumerate(len(p) for p in np.array_split(np.arange(n), shards)):
        with open(os.path.join(path, shard_name(split, i, shards)), "wb") as w:
            for _ in range(size):
                w.write(frame(next(it)))


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    """JPEG bytes of a uint8 RGB image, with Pillow (matplotlib's dependency) rather than
    a TensorFlow op, which would start TensorFlow's runtime before the harness pins it."""
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(image, "RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def synthetic_images(samples: int, side: int, classes: int, seed: int):
    """Yields (uint8 image (side, side, 3), label in 0..classes-1), one at a time (224 px
    x many samples would not fit in memory at once): a class colour and a class stripe
    orientation, with a per-image colour shift and pixel noise. Colour survives random
    crops and flips, so a few epochs learn it; the noise keeps it from being trivial."""
    rng = np.random.default_rng(seed)
    colours = rng.uniform(0.2, 0.8, (classes, 3))
    angles = np.pi * np.arange(classes) / classes
    freq = 2 * np.pi * 3 / side  # three stripes across the image
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    for c in rng.integers(0, classes, samples):
        stripes = 0.12 * np.sin(freq * (xx * np.cos(angles[c]) + yy * np.sin(angles[c])))
        img = (colours[c] + rng.normal(0, 0.06, 3))[None, None, :] + stripes[..., None]
        img = img + rng.normal(0, 0.15, (side, side, 3))
        yield np.clip(img * 255, 0, 255).astype(np.uint8), int(c)


# ---- tf.train.Example in protobuf's wire format -----------------------------------------
# Written and read here in plain Python, so that a node without TensorFlow (nor protobuf)
# reads and writes the same files: Example {Features features = 1}; Features {map<string,
# Feature> feature = 1}, each entry {string key = 1; Feature value = 2}; Feature {oneof
# BytesList bytes_list = 1, FloatList float_list = 2, Int64List int64_list = 3}; each list
# {repeated value = 1}, floats and int64s packed as TensorFlow writes them (unpacked ones
# are read too). tests/test_datasets.py checks both directions against TensorFlow's protos.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                  # a negative int64: two's complement, 10 bytes
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _BYTES) + _varint(len(payload)) + payload


def encode_example(features: dict) -> bytes:
    """A serialized tf.train.Example of `features`: name -> a list of bytes (a BytesList),
    of floats (a FloatList: a list of Python floats or a numpy float array) or of ints (an
    Int64List)."""
    entries = []
    for name, values in features.items():
        values = list(values)
        if all(isinstance(v, bytes) for v in values):
            feature = _delimited(1, b"".join(_delimited(1, v) for v in values))
        elif all(isinstance(v, (int, np.integer)) for v in values):
            feature = _delimited(3, _delimited(1, b"".join(_varint(int(v)) for v in values)))
        else:
            feature = _delimited(2, _delimited(1, np.asarray(values, "<f4").tobytes()))
        entries.append(_delimited(1, _delimited(1, name.encode()) + _delimited(2, feature)))
    return _delimited(1, b"".join(entries))


def parse_example(record: bytes) -> dict:
    """name -> list of bytes | float32 array | int64 array: the features of a serialized
    tf.train.Example. ValueError for bytes that are not one (truncated, a wrong wire type)."""
    out = {}
    for number, _, features in _fields(record, _BYTES):
        if number != 1:
            continue
        for n, _, entry in _fields(features, _BYTES):
            if n != 1:
                continue
            name, feature = "", b""
            for k, _, v in _fields(entry, _BYTES):
                if k == 1:
                    name = v.decode("utf-8", "replace")
                elif k == 2:
                    feature = v
            out[name] = _feature(feature)
    return out


def _feature(feature: bytes):
    for kind, _, values in _fields(feature, _BYTES):
        items = list(_fields(values))
        if kind == 1:
            return [bytes(v) for k, _, v in items if k == 1]
        if kind == 2:
            return np.concatenate([np.frombuffer(v, "<f4") for k, _, v in items if k == 1] or [np.zeros(0, "<f4")]
                                  ).astype(np.float32)
        if kind == 3:
            ints = [i for k, wire, v in items if k == 1
                    for i in (_unpack_varints(v) if wire == _BYTES else [v])]
            return np.array([i - (1 << 64) if i >> 63 else i for i in ints], np.int64)
    return []


def _unpack_varints(data: bytes) -> list:
    out, pos = [], 0
    while pos < len(data):
        v, pos = _read_varint(data, pos)
        out.append(v)
    return out


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("not a tf.train.Example: a truncated or overlong varint")
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not b & 0x80:
            return value, pos


def _fields(data: bytes, only: int | None = None):
    """(field number, wire type, value) of each field of a message: an int for a varint,
    bytes otherwise (a FIXED32 value as its 4 bytes, the float list's unpacked form).
    `only`: the wire type every field must have (ValueError otherwise)."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if only is not None and wire != only:
            raise ValueError(f"not a tf.train.Example: field {number} of wire type {wire}, expected {only}")
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire == _BYTES:
            size, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ValueError(f"not a tf.train.Example: wire type {wire}")
        if pos > len(data):
            raise ValueError("not a tf.train.Example: a field runs past the end")
        yield number, wire, value

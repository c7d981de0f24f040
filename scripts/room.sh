#!/usr/bin/env bash
# Before a venv is made: is there room for it? pip, out of room, stops half-way through an
# 800 MB wheel with "[Errno 28] No space left on device" and leaves a venv that is neither
# there nor gone; this says beforehand what it needs, where, and how much is free.
#   scripts/room.sh VENV NEED_MB WHAT [DOWNLOAD_MB]
# VENV's file system must hold NEED_MB (the venv as installed plus the largest wheel pip
# unpacks beside it); pip's temporary folder ($TMPDIR, else /tmp), where that wheel is
# downloaded, must hold DOWNLOAD_MB (default 900: MindSpore's wheel is 804 MB) when it is on
# another file system. Sizes: the Makefile.
set -euo pipefail
venv=$1 need=$2 what=$3 download=${4:-900}
free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
fs() { df -P "$1" | awk 'NR == 2 { print $6 }'; }
mkdir -p "$venv"
tmp=${TMPDIR:-/tmp}
free=$(free_mb "$venv")
if (( free < need )); then
    echo "scripts/room.sh: found ${free} MB free on $(fs "$venv") (for $venv), expected at least ${need} MB:" \
         "a venv with $what takes about that, with the largest wheel pip unpacks; free some space or" \
         "name a venv on another disk (make VENV=/path/.venv)" >&2
    exit 1
fi
# (a TMPDIR that does not exist is pip's to refuse, in its own words)
if [[ -d $tmp ]] && [[ $(fs "$tmp") != $(fs "$venv") ]] && (( (tmp_free = $(free_mb "$tmp")) < download )); then
    echo "scripts/room.sh: found ${tmp_free} MB free on $(fs "$tmp") (pip's temporary folder $tmp)," \
         "expected at least ${download} MB: pip downloads the largest wheel there; set TMPDIR to a" \
         "folder with room" >&2
    exit 1
fi

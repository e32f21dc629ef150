#!/usr/bin/env python3
"""Runs a command while holding an exclusive flock on FILE that processes
asking for the lock later cannot overtake, so a measurement waits only for the
shared holders (e.g. builds run as `flock -s FILE make`) already running, and
new ones wait for it.

usage: python3 bench/quietly.py FILE CMD [ARGS...]

How: a fresh file is locked first and renamed over FILE (later `flock -s FILE`
callers open it and wait); then the old file's exclusive lock waits for the
shared holders of the old file only. Exits with the command's status."""
import fcntl, os, subprocess, sys


def quiet_lock(path):
    old = open(path, "a")
    new = open(path + ".new", "w")
    fcntl.flock(new, fcntl.LOCK_EX)
    os.rename(path + ".new", path)
    fcntl.flock(old, fcntl.LOCK_EX)
    return old, new


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    held = quiet_lock(sys.argv[1])
    try:
        sys.exit(subprocess.call(sys.argv[2:]))
    finally:
        for f in held:
            f.close()

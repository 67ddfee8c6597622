#!/usr/bin/env python3
"""A FUSE passthrough of ROOT at MOUNTPOINT, in the foreground (fusepy).

The end-to-end tests put the checkpoint directory on it and SIGSTOP this
process to make the volume hang (every call on the mount then blocks, as on
an NFS server that stopped answering); SIGCONT makes it answer again.
Usage: fuse_passthrough.py ROOT MOUNTPOINT
"""
import errno
import os
import sys

try:
    from fusepy import FUSE, FuseOSError, Operations
except ImportError:  # PyPI's fusepy installs the module as `fuse`
    from fuse import FUSE, FuseOSError, Operations


class Passthrough(Operations):
    def __init__(self, root):
        self.root = root

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def access(self, path, mode):
        if not os.access(self._p(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = os.lstat(self._p(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def chmod(self, path, mode):
        return os.chmod(self._p(path), mode)

    def chown(self, path, uid, gid):
        return os.chown(self._p(path), uid, gid)

    def mkdir(self, path, mode):
        return os.mkdir(self._p(path), mode)

    def rmdir(self, path):
        return os.rmdir(self._p(path))

    def unlink(self, path):
        return os.unlink(self._p(path))

    def rename(self, old, new):
        return os.rename(self._p(old), self._p(new))

    def utimens(self, path, times=None):
        return os.utime(self._p(path), times)

    def statfs(self, path):
        s = os.statvfs(self._p(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(s, k) for k in keys}

    def open(self, path, flags):
        return os.open(self._p(path), flags)

    def create(self, path, mode, fi=None):
        return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, length, offset, fh):
        return os.pread(fh, length, offset)

    def write(self, path, buf, offset, fh):
        return os.pwrite(fh, buf, offset)

    def truncate(self, path, length, fh=None):
        with open(self._p(path), "r+b") as f:
            f.truncate(length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return os.close(fh)

    def fsync(self, path, datasync, fh):
        return os.fsync(fh)


if __name__ == "__main__":
    root, mountpoint = sys.argv[1], sys.argv[2]
    print(f"serving {root} at {mountpoint}", flush=True)
    FUSE(Passthrough(root), mountpoint, foreground=True, nothreads=True, allow_other=True)

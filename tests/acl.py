"""POSIX ACLs for the hostile-user tests, set as `setfacl -m u:NAME:rwx` would (the xattr Linux
keeps them in, written directly: setfacl need not be installed). The mode's group bits become
the ACL's mask, as setfacl makes them, so `ls -l` shows `+` and the mask."""

from __future__ import annotations

import os
import struct
from pathlib import Path

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_ANY = 0xFFFFFFFF


def _entries(mode: int, uid: int, perm: int) -> bytes:
    owner, group, other = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
    entries = [(_USER_OBJ, owner, _ANY), (_USER, perm, uid), (_GROUP_OBJ, group, _ANY),
               (_MASK, group | perm, _ANY), (_OTHER, other, _ANY)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, p, ident) for tag, p, ident in entries)


def grant(path: "str | Path", uid: int, perm: int = 7) -> None:
    """`setfacl -m u:UID:PERM PATH`: that user may read/write/enter it (perm: rwx as 4/2/1)."""
    mode = os.stat(path).st_mode & 0o777
    os.setxattr(path, ACCESS, _entries(mode, uid, perm))


def grant_default(folder: "str | Path", uid: int, perm: int = 7) -> None:
    """`setfacl -d -m u:UID:PERM FOLDER`: what is made in the folder from now on grants it."""
    mode = os.stat(folder).st_mode & 0o777
    os.setxattr(folder, DEFAULT, _entries(mode, uid, perm))

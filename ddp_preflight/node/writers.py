"""Who besides its owner may write a file or folder: the one answer for every ownership walk
(node/private.py, node/trust.py, the ssh configs' check). The mode's bits, and a POSIX ACL where
there is one: `setfacl -m u:bob:rw` on root's file leaves its mode 0664 with a private group, and
yet bob may write it. Standard library only, Python 3.8+."""

from __future__ import annotations

import errno
import os
import stat
import struct
from typing import List, Optional, Tuple

__all__ = ["others_may_write", "writable_mode", "acl"]


def others_may_write(st: os.stat_result, where: "str | int") -> bool:
    """Anyone but the owner may write it (`where`: its path, or a descriptor of it; st: its
    lstat). Group write counts only if the group holds someone else: with a user's private group
    (umask 002: Fedora, RHEL) only the owner is in it. A POSIX ACL counts as what it grants (the
    mode's group bits are then only its mask): a named user or group that may write, or, on a
    folder, a default ACL that would let others write what is made in it."""
    if st.st_mode & 0o002:
        return True
    if stat.S_ISLNK(st.st_mode):
        return False        # a link's own mode means nothing (its folder says who may replace it)
    access = acl(where, ACL_ACCESS)
    default = acl(where, ACL_DEFAULT) if stat.S_ISDIR(st.st_mode) else []
    if access is None or default is None:
        return True         # an ACL that cannot be read: it may grant anything
    if default and _acl_lets_others_write(default, st, default=True):
        return True
    if access:
        return _acl_lets_others_write(access, st, default=False)
    return bool(st.st_mode & 0o020) and _group_holds_others(st.st_gid, st.st_uid)


def writable_mode(st: os.stat_result, where: "str | int") -> str:
    """The mode as a refusal says it: `775`, or `775, with an ACL` when an ACL is what lets
    others write (its mask is then the mode's group bits)."""
    mode = f"{stat.S_IMODE(st.st_mode):o}"
    if st.st_mode & 0o002 or stat.S_ISLNK(st.st_mode):
        return mode
    return f"{mode}, with an ACL" if acl(where, ACL_ACCESS) or (
        stat.S_ISDIR(st.st_mode) and acl(where, ACL_DEFAULT)) else mode


# POSIX ACLs as Linux keeps them (linux/posix_acl_xattr.h): a version, then (tag, perm, id) each.
ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ACL = (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def acl(where: "str | int", name: str) -> Optional[List[Tuple[int, int, int]]]:
    """The ACL's (tag, perm, id) entries; [] when there is none; None when it cannot be read."""
    if not hasattr(os, "getxattr"):
        return []           # no xattrs here (not Linux): no POSIX ACL either
    try:
        if isinstance(where, int):
            # An O_PATH descriptor cannot be asked (EBADF): its /proc name can, without a path walk.
            data = os.getxattr(f"/proc/self/fd/{where}", name)
        else:
            data = os.getxattr(where, name, follow_symlinks=False)
    except OSError as exc:
        return [] if exc.errno in _NO_ACL else None
    if len(data) < 4 or (len(data) - 4) % 8 or struct.unpack_from("<I", data)[0] != 2:
        return None
    return [struct.unpack_from("<HHI", data, at) for at in range(4, len(data), 8)]


def _acl_lets_others_write(entries: List[Tuple[int, int, int]], st: os.stat_result, default: bool) -> bool:
    """Whether someone but the owner (root and this user aside) may write through these entries.
    The mask bounds every named entry and the owning group's; a default ACL's `other` entry is
    what files made in the folder will give everyone."""
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 7)
    for tag, perm, ident in entries:
        if tag == _ACL_OTHER:
            if default and perm & 2:
                return True
            continue
        if not perm & mask & 2:
            continue
        if tag == _ACL_USER and ident not in (0, st.st_uid, os.geteuid()):
            return True
        if tag == _ACL_GROUP and _group_holds_others(ident, st.st_uid):
            return True
        if tag == _ACL_GROUP_OBJ and _group_holds_others(st.st_gid, st.st_uid):
            return True
    return False


def _group_holds_others(gid: int, owner_uid: int) -> bool:
    """The group holds a user besides the owner (as a member, or as its primary group)."""
    import grp
    import pwd
    try:
        owner = pwd.getpwuid(owner_uid).pw_name
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:          # an owner or group with no name here: cannot tell who is in it
        return True
    return bool(members - {owner}) or any(p.pw_gid == gid and p.pw_uid != owner_uid for p in pwd.getpwall())

"""What a value of a hosts file may be, checked before it reaches a command line, a shell or a template.

A host's address reaches ssh's and ``mpiexec``'s command lines, the MLX ring hostfile and OpenMPI's
hostfile; its user and Python reach ssh and the remote login shell; its name becomes a Slurm node name in
a batch template that ipyparallel formats with IPython's ``EvalFormatter`` (which evaluates every
``{...}``). So each value is matched against what it may be (a name or IPv4 address, a user name, a
path), and ``{``/``}``, control characters (a newline adds a line to a script), whitespace where a value
is split, and a leading ``-`` (an option) are refused, naming the field.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import stat

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")  # a DNS name, a Slurm node name, a label
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\$?")  # POSIX user names (and Samba's trailing $)
PYTHON = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./+,:@-]{0,4095}")  # a path: no shell syntax, no NAME=value word
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_WHAT = {"address": "an IPv4 address or a host name", "user": "a user name (letters, digits, '.', '_', '-')",
         "python": "the path of the Python on that host (letters, digits and ./_+,:@- only, no '~')",
         "name": "a label, also the host's Slurm node name (letters, digits, '.', '_', '-')",
         "ssh_config": "a path on this machine"}


def check_text(value, field: str, *, pattern: re.Pattern | None = None, split: bool = True, where: str = "",
               what: str | None = None) -> str:
    """``value`` if it is a string that is safe on a command line, in a script or a template.

    Args:
        field: The value's name in messages (``Host.user``).
        pattern: What the whole value must match (after the generic checks).
        split: Whether whitespace is refused (a value that something splits on spaces).
        where: Appended to ``field`` in messages (`` (host 10.0.0.11)``).
        what: What the value must be, in messages (default: by the field's last part, ``user``).

    Raises:
        ValueError: naming ``field``, the value and what is wrong with it.
    """
    what = what or _WHAT.get(field.rsplit(".", 1)[-1], "a plain word")
    if not isinstance(value, str):
        raise ValueError(f"{field}={value!r}{where}: must be a string ({what}), not {type(value).__name__}")
    spaced = split and any(c.isspace() for c in value)
    why = ("is empty" if not value
           else "contains a control character (a newline would add a line to a script)"
           if any(not c.isprintable() for c in value)
           else "contains '{' or '}' (a batch template would evaluate them)" if "{" in value or "}" in value
           else "contains whitespace (it would be split into several words)" if spaced
           else "starts with '-' (it would be read as an option)" if value.startswith("-")
           else f"is not {what}" if pattern is not None and not pattern.fullmatch(value) else "")
    if why:
        raise ValueError(f"{field}={value!r}{where}: {why}")
    return value


def _check_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, field: str, value: str) -> None:
    plain = getattr(ip, "ipv4_mapped", None) or ip
    if plain.is_unspecified or plain.is_loopback or plain in ipaddress.ip_network("0.0.0.0/8") or plain.is_multicast \
            or plain == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{field}={value!r}: a wildcard or loopback address (or a broadcast or multicast one) cannot "
                         "be reached from another host; give the address the hosts reach each other by")
    if ip.version == 6:
        hint = f" ({plain})" if plain is not ip else ""
        raise ValueError(f"{field}={value!r}: IPv6 addresses are not supported (ipyparallel splits host:port at the "
                         f"first ':', and the MLX ring hostfile and OpenMPI take addresses unbracketed); give the "
                         f"IPv4 address{hint} or a name that resolves to it")


def check_address(value, field: str = "address") -> str:
    """``value`` if it is an IPv4 address or a host name another host can reach (see :func:`check_text`).

    Raises:
        ValueError: naming ``field``: a wildcard, loopback, broadcast or IPv6 address (also IPv4-mapped,
            and the legacy spellings ``0``, ``127.1``), ``localhost``, or not an address or name.
    """
    check_text(value, field)
    if value == "*":
        raise ValueError(f"{field}='*': a wildcard cannot be reached from another host; give the address the hosts "
                         "reach each other by")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if ip is not None:
        _check_ip(ip, field, value)
        return value
    try:  # what ipaddress refuses but inet_aton (and so ssh and getaddrinfo) reads as IPv4: '0', '127.1', '0x7f.1'
        legacy = ipaddress.IPv4Address(socket.inet_aton(value))
    except OSError:
        legacy = None
    if legacy is not None:
        _check_ip(legacy, field, value)
        raise ValueError(f"{field}={value!r}: write the IPv4 address in dotted form ({legacy})")
    check_text(value, field, pattern=NAME)
    if value.lower().rstrip(".") in _LOCAL_NAMES or value.lower().rstrip(".").endswith(".localhost"):
        raise ValueError(f"{field}={value!r}: a loopback name cannot be reached from another host; give the address "
                         "the hosts reach each other by")
    return value


def check_controller_ip(value, field: str = "controller_ip") -> str:
    """The controller's listen address, normalised (``ipaddress``): an IPv4 address of this machine.

    ZeroMQ binds to it, so it must be a literal address: never a wildcard (``*``, ``0.0.0.0``, ``::``, and
    every spelling of them), loopback (``127.x``, ``::1``, ``::ffff:127.0.0.1``, ``localhost``) or a name.

    Raises:
        ValueError: naming ``field``.
    """
    if not isinstance(value, str):
        raise ValueError(f"{field}={value!r}: must be a string (this machine's IPv4 address that the hosts reach)")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        check_address(value, field)  # names the wildcard and loopback spellings
        raise ValueError(f"{field}={value!r}: must be this machine's IPv4 address that the hosts reach, written as "
                         "an address (the controller binds to it: not a name, '*' or an interface)") from None
    _check_ip(ip, field, value)
    return str(ip)


def check_ssh_config_file(path: str, field: str = "ssh_config") -> str:
    """``path`` if ssh may read it as ``-F``: a regular file owned by this user (or root), writable by no one else.

    ssh runs the commands a config names (``ProxyCommand``, ``LocalCommand``, ``Match exec``,
    ``KnownHostsCommand``) and checks nothing of a ``-F`` file; this is what it demands of ``~/.ssh/config``,
    so a hosts file cannot point ssh at a config someone else could have written.

    Raises:
        ValueError: naming ``field`` and the file.
    """
    try:
        st = os.stat(path)
    except OSError as err:
        raise ValueError(f"{field}={path!r}: cannot be read ({err.strerror or err})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{field}={path!r}: not a regular file")
    if st.st_uid not in (os.getuid(), 0) or st.st_mode & 0o022:
        raise ValueError(f"{field}={path!r}: owned by uid {st.st_uid} with mode {stat.filemode(st.st_mode)}; ssh "
                         "runs the commands a config names (ProxyCommand, LocalCommand, Match exec), so it must be "
                         "owned by you (or root) and writable by no one else, as ssh requires of ~/.ssh/config")
    return path


__all__ = ["NAME", "PYTHON", "USER", "check_address", "check_controller_ip", "check_ssh_config_file", "check_text"]

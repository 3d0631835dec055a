"""What goes wrong with the rig, by whose fault: this machine's (RigUnavailable) or the rig's (RigError)."""

from __future__ import annotations


class RigUnavailable(RuntimeError):
    """This machine cannot host the rig (not Linux, not root, no iproute2, no netns, no sshd); says which and why."""


class RigError(RuntimeError):
    """Building, checking or tearing down the rig failed."""


class SlurmUnavailable(RigUnavailable):
    """Slurm on the rig cannot run here: slurm-wlm or munge missing, or one of their daemons did not start
    (the message quotes its log). The rest of the rig was fine; nothing is left behind."""

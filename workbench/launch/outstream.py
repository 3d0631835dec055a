"""What an engine does with its output: Python's prints go to the client, native output to the engine's log.

ipykernel's ``OutStream`` (the engine's ``sys.stdout`` / ``sys.stderr``) also captures the process's
file descriptors 1 and 2 by default: native code's writes (an MLX ``[ring] Couldn't connect``, a C++
abort's message) go into a pipe that a thread of the engine reads and echoes to the real descriptor.
An engine that aborts right after writing loses the line whenever that thread has not run yet (under
load it often has not), and the run's error then quoted an empty log (issue 14's flaky test). With
:class:`DirectFdOutStream` the descriptors stay the engine's log file, written before the process can
exit, while ``print`` still reaches the notebook as before.
"""

from __future__ import annotations

from ipykernel.iostream import OutStream

#: The engine option that installs it (every launcher passes it to ``ipyparallel.engine``).
ENGINE_ARG = f"--IPEngine.out_stream_factory={__name__}.DirectFdOutStream"


class DirectFdOutStream(OutStream):
    """``OutStream`` without file-descriptor capture (``watchfd=False``)."""

    def __init__(self, *args, **kwargs):
        kwargs["watchfd"] = False
        super().__init__(*args, **kwargs)

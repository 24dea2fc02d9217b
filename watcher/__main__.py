"""The `pod-resources-watcher` command (and `python -m watcher`).

SIGHUP asks a running agent to reload; its default action is to kill. Importing
the agent (gRPC, aiohttp, protobuf) takes about half a second, and a SIGHUP in
that window, say from a config tool that signals every process it finds, would
end the process with status 129. So the first thing the command does is ignore
SIGHUP; `run` handles it once the agent is running, every other command
restores the default.
"""

import signal

signal.signal(signal.SIGHUP, signal.SIG_IGN)


def main() -> int:
    from watcher.cli import main as cli_main  # after the line above, on purpose

    return cli_main(hup_ignored=True)


if __name__ == "__main__":
    raise SystemExit(main())

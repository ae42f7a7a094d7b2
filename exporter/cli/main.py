"""Command line: flags (each also from `KDE_<NAME>` in the environment) -> frozen Config.

    kube-device-exporter [FLAGS]                   run the exporter
    kube-device-exporter podresources [--pod NS/NAME] [FLAGS]
                                                   print what the kubelet reports (debugging)
    kube-device-exporter doctor [FLAGS]            why are my metrics missing? (exit 1: yes)
    kube-device-exporter help [COMMAND]            the --help of the exporter or a command

A bad value exits 2 with one line naming the flag or variable.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from exporter.cli.flags import parse_config
from exporter.cli.parser import DOCTOR, PROG, UsageError, usage_error

HELP_TOPICS = ("podresources", "doctor", "help")
"""What `help` takes: the other commands (`help help` is the exporter's own help)."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["help"]:  # `help` and `help doctor`, as `git help` and `helm help` read
            argv = _help(argv[1:])
        if argv[:1] == ["podresources"]:
            from exporter.cli.podresources import run_inspect

            return run_inspect(argv[1:])
        if argv[:1] == ["doctor"]:
            from exporter.cli.doctor import run_doctor

            return run_doctor(parse_config(argv[1:], prog=f"{PROG} doctor", description=DOCTOR))
        config = parse_config(argv)
    except UsageError as exc:
        return usage_error(str(exc))
    from exporter.app import run

    return run(config)


def _help(topics: list[str]) -> list[str]:
    """`help [COMMAND]` as the argv that prints that help; a command that does not exist,
    or more than one, is a usage error (exit 2), as `git help bogus` is."""
    if len(topics) > 1 or (topics and topics[0] not in HELP_TOPICS):
        raise UsageError(
            f"help: no command {' '.join(topics)!r}; the commands are "
            f"{', '.join(HELP_TOPICS)} (and the exporter itself: {PROG} --help)"
        )
    return [*(t for t in topics if t != "help"), "--help"]

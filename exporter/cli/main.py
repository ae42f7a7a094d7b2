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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["help"]:  # `help` and `help doctor`, as `git help` and `helm help` read
        argv = [*argv[1:2], "--help"]
    try:
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

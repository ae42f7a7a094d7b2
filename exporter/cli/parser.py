"""The command line's parser: flags from the settings table, the metric groups and the source
registry; --help; a bad value as a UsageError with one line naming the flag (exit 2).

Each flag is also `KDE_<NAME>` in the environment (`env_name`); `flags.py` turns what is
given into the Config.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from exporter import __version__
from exporter.settings.table import CORE, FLAGS, GROUP_TITLES, GROUPS
from exporter.settings.values import METAVARS, boolean
from exporter.sources import SourceInfo, registry

PROG = "kube-device-exporter"
ENV_PREFIX = "KDE_"

COMMANDS = (
    (
        "podresources [--pod NS/NAME] [-o table|json] [--devices-only] [--resource GLOB] [-n NS]",
        "print what the kubelet reports: device IDs, resources",
    ),
    ("doctor [FLAGS]", "why are my metrics missing? checks the kubelet, each source, /proc"),
    ("help [COMMAND]", "this help, or a command's (as --help)"),
)
"""The other commands, as the exporter's --help lists them."""

DOCTOR = (
    "Why are my metrics missing? Asks the kubelet once, runs each enabled source once, looks "
    "at the host /sys and /proc, and compares what the node advertises with what the sources "
    "see (with --kubernetes.api: the API server and the kubelet's Pods API too): one line "
    "per check, the likely cause and the fix for each problem; exit 1 when "
    "there is one. Run it in the exporter's pod with the exporter's flags."
)


class UsageError(Exception):
    """Raised by parsers instead of printing; main() turns it into one line and exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse, raising UsageError, and taking no abbreviation: `--web.listen` would be
    `--web.listen-address` today and ambiguous the day a `--web.listen-*` flag is added, and
    the `KDE_*` variables have no abbreviated form."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message + self._did_you_mean(message))

    def _did_you_mean(self, message: str) -> str:
        """`; did you mean --web.listen-address?` for an unknown flag that begins one, or
        is close to one (a typo)."""
        unknown = "unrecognized arguments: "
        if not message.startswith(unknown):
            return ""
        flag = next((t for t in message[len(unknown) :].split() if t.startswith("--")), "")
        name = flag.partition("=")[0]
        known = [o for o in self._option_string_actions if o.startswith("--")]
        near = [o for o in known if name and o.startswith(name)] or difflib.get_close_matches(
            name, known, n=1
        )
        return f"; did you mean {' or '.join(sorted(near)[:3])}?" if name and near else ""


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports our ValueError text."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    wrapped.__name__ = parse.__name__
    return wrapped


def env_name(flag: str) -> str:
    """`--web.listen-address` -> `KDE_WEB_LISTEN_ADDRESS`."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", flag.lstrip("-")).upper()


def _metavar(metavar: str, parse: Callable[[str], Any]) -> str:
    return metavar or METAVARS.get(getattr(parse, "__name__", ""), "VALUE")


def _default_note(default: str, flag: str) -> str:
    return f"(default {default}; env {env_name(flag)})" if default else f"(env {env_name(flag)})"


def build_parser(
    sources: dict[str, SourceInfo] | None = None, prog: str = PROG, description: str = ""
) -> Parser:
    sources = registry() if sources is None else sources
    commands = "\n".join(f"  {PROG} {usage}\n      {what}" for usage, what in COMMANDS)
    parser = Parser(
        prog=prog,
        description=textwrap.fill(
            (description or "Which pod uses which GPU, accelerator or NIC, and how hard.")
            + " Every flag can also be set as KDE_<FLAG> in the environment"
            " (--web.listen-address -> KDE_WEB_LISTEN_ADDRESS); flags win. A bad value exits 2"
            " naming the flag.",
            width=79,
        ),
        epilog=f"other commands:\n{commands}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    groups = {k: parser.add_argument_group(v) for k, v in GROUP_TITLES.items()}
    for row in FLAGS:
        kwargs: dict[str, Any] = {
            "dest": row.dest,
            "type": _typed(row.parse),
            "metavar": _metavar(row.metavar, row.parse),
        }
        # Absent unless given: a flag whose value parses to None (`--web.listen-address none`)
        # must still win over the environment and the default.
        kwargs["default"] = argparse.SUPPRESS
        if row.repeatable:
            kwargs["action"] = "append"
        if row.parse is boolean:  # `--kubernetes.api` alone means on
            kwargs["nargs"] = "?"
            kwargs["const"] = True
        help_ = f"{row.help} {_default_note(row.default, row.flag)}"
        groups[row.group].add_argument(row.flag, help=help_, **kwargs)
    for group in GROUPS:
        if group.name == CORE:
            continue  # always on
        flag = f"--metrics.group.{group.name}"
        groups["metrics"].add_argument(
            flag,
            dest=f"metrics_group_{group.name}",
            action=argparse.BooleanOptionalAction,
            help=f"{group.help} (default {'on' if group.default else 'off'}; env {env_name(flag)})",
        )
    for info in sources.values():
        flag = f"--collector.{info.name}"
        groups["collectors"].add_argument(
            flag,
            dest=f"collector_{info.name}",
            action=argparse.BooleanOptionalAction,
            help=f"{info.help} (default {'on' if info.default_enabled else 'off'}; "
            f"env {env_name(flag)})",
        )
        # BooleanOptionalAction spells the negative --no-collector.X: what node_exporter users type.
        for option in info.options:
            oflag = f"--collector.{info.name}.{option.name}"
            groups["collectors"].add_argument(
                oflag,
                dest=f"option_{info.name}_{option.name}",
                type=_typed(validated(option.parse)),
                metavar=_metavar("", option.parse),
                help=f"{option.help} {_default_note(option.default, oflag)}",
            )
    return parser


def validated(parse: Callable[[str], object]) -> Callable[[str], str]:
    """A source option's check: the source gets the text, but only text its type accepts."""

    def check(text: str) -> str:
        parse(text)
        return text

    check.__name__ = getattr(parse, "__name__", "check")
    return check


def attach_dash_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`--collect-interval -5s` -> `--collect-interval=-5s`: argparse takes a value that
    starts with `-` for a flag and answers "expected one argument"; joined, the value reaches
    its type, whose error names what is wrong with it."""
    out: list[str] = []
    takes_value = {
        name
        for action in parser._actions
        if action.nargs is None and action.option_strings
        for name in action.option_strings
    }
    for token in argv:
        prev = out[-1] if out else ""
        if (
            prev in takes_value
            and token.startswith("-")
            and token not in parser._option_string_actions
        ):
            out[-1] = f"{prev}={token}"
        else:
            out.append(token)
    return out


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    return parser.parse_args(attach_dash_values(parser, argv))


def usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2

"""What every eventop command line shares: a configuration mistake is one line and exit 2.

The router, the watcher, the local API server and the demo each read flags and, for most
flags, an environment variable with the same meaning (one image is configured by a
Deployment's ``env``). A mistake in either is reported before anything starts, as one line
that names the flag or variable, says what was given and what is accepted, with exit status
2 (argparse's and most Unix tools' status for a usage error): never a traceback, never a
process that retries forever because of a typo.

Only the standard library is imported here: ``python -m eventop.router`` parses its options
before prometheus_client may be imported (see :mod:`eventop.router.__main__`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from eventop import variables
from eventop.names import is_dns_label, is_dns_subdomain

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "text")


class ConfigError(ValueError):
    """A flag or environment variable asks for something eventop cannot do.

    The message says what is wrong and what is accepted; :func:`report` prints it as the one
    line a user sees.
    """


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported on one line instead of the usage block plus a line.

    The usage block of a command with twenty options hides the one line that matters;
    ``--help`` is one step away and the message says so.
    """

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Parse, then refuse a misspelt ``EVENTOP_*`` name (:mod:`eventop.variables`) and
        convert (and so check) the values taken from environment variables
        (:func:`env_flag`); a mistake there is reported like a mistaken flag."""
        parsed, extras = super().parse_known_args(args, namespace)
        misspelt = variables.unknown()
        if misspelt:
            self.error(variables.describe(misspelt))
        try:
            _resolve_env(parsed)
        except ConfigError as exc:
            self.error(str(exc))
        return parsed, extras


def report(prog: str, error: ConfigError) -> int:
    """Print a configuration error as one line on stderr; return the exit status, 2. (A
    message quoting a library's, a YAML parser's say, is folded onto that one line.)"""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip())
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    return 2


# -- value checks: each raises ArgumentTypeError, whose message argparse shows as it is ------

def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """A converter for an integer flag within ``[minimum, maximum]``."""
    wanted = _range_words("an integer", minimum, maximum)

    def convert(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, not {text!r}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {wanted}, not {value}")
        return value
    convert.__name__ = "integer"
    return convert


def number(minimum: float | None = None, *, above: float | None = None
           ) -> Callable[[str], float]:
    """A converter for a number of seconds (or any float) of at least ``minimum``, or
    strictly greater than ``above``."""
    wanted = ("a number" + (f" of at least {minimum:g}" if minimum is not None else "")
              + (f" greater than {above:g}" if above is not None else ""))

    def convert(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, not {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")) \
                or (minimum is not None and value < minimum) \
                or (above is not None and value <= above):
            raise argparse.ArgumentTypeError(f"expected {wanted}, not {text!r}")
        return value
    convert.__name__ = "number"
    return convert


def choice(values: Sequence[str]) -> Callable[[str], str]:
    """A converter for one of ``values``, case-insensitive (``INFO`` and ``info`` alike)."""
    def convert(text: str) -> str:
        value = str(text).strip().lower()
        if value not in values:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(values)}, "
                                             f"not {text!r}")
        return value
    convert.__name__ = "choice"
    return convert


def boolean(text: str | bool) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0``."""
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host."""
    parts = urlsplit(str(text).strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, not {text!r}")
    return str(text).strip()


NAMESPACE_RULE = ("a namespace name: lower case letters, digits and '-', at most 63, starting and "
                  "ending with a letter or digit")
NAME_RULE = ("an object name: lower case letters, digits, '-' and '.', at most 253, starting "
             "and ending with a letter or digit")


def namespace_name(text: str) -> str:
    """A converter for a namespace's name."""
    value = str(text).strip()
    if not is_dns_label(value):
        raise argparse.ArgumentTypeError(f"expected {NAMESPACE_RULE}, not {text!r}")
    return value


def object_name(text: str) -> str:
    """A converter for an object's name (RFC 1123 subdomain)."""
    value = str(text).strip()
    if not is_dns_subdomain(value):
        raise argparse.ArgumentTypeError(f"expected {NAME_RULE}, not {text!r}")
    return value


def _range_words(what: str, minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{what} from {minimum} to {maximum}"
    if minimum is not None:
        return f"{what} of at least {minimum}"
    if maximum is not None:
        return f"{what} of at most {maximum}"
    return what


PORT = integer(0, 65535)


def kubeconfig_files(value: str, source: str) -> list[str]:
    """The files of a kubeconfig setting (``KUBECONFIG`` may list several, like kubectl);
    :class:`ConfigError` when none of them exists."""
    paths = [os.path.expanduser(p) for p in value.split(os.pathsep) if p.strip()]
    existing = [p for p in paths if os.path.isfile(p)]
    if paths and not existing:
        raise ConfigError(f"{source}: no such file {', '.join(paths)}")
    for path in existing:
        _check_kubeconfig(path, source)
    return existing


def _check_kubeconfig(path: str, source: str) -> None:
    """A file that is not a kubeconfig at all: the client's loader fails on it with a bare
    ``TypeError: 'str' object does not support item assignment``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # the loader's own message says where (the callers make it one line)
    if loaded is not None and not isinstance(loaded, dict):  # (a partial one merges fine)
        raise ConfigError(f"{source}: {path} is not a kubeconfig (a YAML mapping with "
                          "clusters, users and contexts, as `kubectl config view` shows)")


# -- flags with an environment variable ---------------------------------------------------

@dataclass(frozen=True)
class FromEnv:
    """A flag's value taken from its environment variable, checked after parsing.

    Kept apart from argparse's own string defaults so that a mistake names the variable
    (``EVENTOP_THREADS: expected ...``), not a flag the user never typed.
    """

    variable: str
    text: str
    convert: Callable[[str], Any]

    def value(self) -> Any:
        try:
            return self.convert(self.text)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ConfigError(f"{self.variable}: {exc}") from None


def env_flag(parser: argparse.ArgumentParser, flag: str, env: str, default: Any, help_: str,
             type_: Callable[[str], Any] = str, **kwargs: Any) -> None:
    """Add ``flag``; when it is not given, ``env`` (if set and not empty), else ``default``.

    :class:`Parser` converts (and so checks) the environment's value after parsing.
    """
    raw = os.environ.get(env, "")
    parser.add_argument(flag, type=type_,
                        default=FromEnv(env, raw, type_) if raw.strip() else default,
                        help=f"{help_} [env {env}; default {default}]", **kwargs)


def _resolve_env(args: argparse.Namespace) -> argparse.Namespace:
    """Replace every value that came from an environment variable by its checked value;
    raises :class:`ConfigError` naming the variable."""
    for name, value in vars(args).items():
        if isinstance(value, FromEnv):
            setattr(args, name, value.value())
    return args


def log_options(parser: argparse.ArgumentParser, default_level: str = "info") -> None:
    """``--log-level`` and ``--log-format`` (JSON lines for collectors, text for terminals)."""
    env_flag(parser, "--log-level", "EVENTOP_LOG_LEVEL", default_level,
             f"log level: {', '.join(LOG_LEVELS)}", choice(LOG_LEVELS))
    env_flag(parser, "--log-format", "EVENTOP_LOG_FORMAT", "json",
             "json: one JSON object per line, for log collectors; text: for a terminal",
             choice(LOG_FORMATS))

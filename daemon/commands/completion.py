"""``bide completion bash|zsh``: the shell completion script, generated from the parser."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from daemon.cli import build_parser
from daemon.completion import bash_script, zsh_script

EPILOG = """\
examples, to install it (once; a new shell then completes commands, options and choices):
  bash: bide completion bash > ~/.local/share/bash-completion/completions/bide
        (needs the bash-completion package; or add `source <(bide completion bash)`
        to ~/.bashrc)
  zsh:  mkdir -p ~/.zfunc && bide completion zsh > ~/.zfunc/_bide
        and in ~/.zshrc, before compinit: fpath=(~/.zfunc $fpath)
        then: autoload -Uz compinit && compinit
Run it again after upgrading bide: the script is made from this version's options.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print the shell completion script for bash or zsh",
        description="Print a completion script for SHELL on stdout, generated from bide's own "
        "argument parser: every command, option and fixed choice of this version.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("shell", choices=("bash", "zsh"), metavar="SHELL", help="bash or zsh")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    parser = build_parser()
    script = bash_script(parser) if args.shell == "bash" else zsh_script(parser)
    sys.stdout.write(script)
    return 0

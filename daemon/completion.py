"""Shell completion for ``bide``, generated from its own argparse parser.

The parser is walked once into a :class:`Grammar` (each command path's subcommands, options,
the options that take a value, and the choices of options and positionals); the bash and zsh
scripts are tables over that grammar plus one fixed completion function each, so an option
added to any command is completed without editing anything here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

__all__ = ["Grammar", "bash_script", "grammar_of", "zsh_script"]


@dataclass
class Grammar:
    """What may follow each command path ("" for ``bide`` itself, "log head" for a nested
    subcommand): words that select a subcommand, option flags, flags that take a value, and
    the fixed choices of a flag (``"PATH FLAG"``) or of a positional (``"PATH"``)."""

    subcommands: dict[str, list[str]] = field(default_factory=dict)
    options: dict[str, list[str]] = field(default_factory=dict)
    takes_value: dict[str, list[str]] = field(default_factory=dict)
    choices: dict[str, list[str]] = field(default_factory=dict)


def grammar_of(parser: argparse.ArgumentParser) -> Grammar:
    grammar = Grammar()
    _walk(parser, "", grammar)
    return grammar


def _walk(parser: argparse.ArgumentParser, path: str, grammar: Grammar) -> None:
    subs: list[str] = []
    options: list[str] = []
    valued: list[str] = []
    positional: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                subs.append(name)
                _walk(child, f"{path} {name}".strip(), grammar)
        elif action.help == argparse.SUPPRESS:
            continue
        elif action.option_strings:
            options += action.option_strings
            if action.nargs != 0:
                valued += action.option_strings
                if action.choices is not None:
                    for flag in action.option_strings:
                        grammar.choices[f"{path} {flag}".strip()] = [str(c) for c in action.choices]
        elif action.choices is not None:
            positional += [str(c) for c in action.choices]
    grammar.subcommands[path] = subs
    grammar.options[path] = options
    grammar.takes_value[path] = valued
    if positional:
        grammar.choices[path] = positional


def _case(function: str, table: dict[str, list[str]]) -> str:
    """A shell function (bash and zsh alike) printing the words ``table`` holds for its
    arguments: a command path, and a flag of it where the table is keyed by both."""
    arms = [
        f"        {_quote(key)}) echo {_quote(' '.join(words))} ;;"
        for key, words in sorted(table.items())
        if words
    ]
    body = "\n".join(arms) if arms else "        *) ;;"
    return f'{function}() {{\n    case "$1${{2:+ $2}}" in\n{body}\n    esac\n}}\n'


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _tables(grammar: Grammar) -> str:
    return "".join(
        _case(f"_bide_{name}", table)
        for name, table in (
            ("subcommands", grammar.subcommands),
            ("options", grammar.options),
            ("takes_value", grammar.takes_value),
            ("choices", grammar.choices),
        )
    )


_BASH = """\
# bash completion for bide, generated from its parser by `bide completion bash`.
# Install: bide completion bash > ~/.local/share/bash-completion/completions/bide
# (or add `source <(bide completion bash)` to ~/.bashrc).
{tables}
_bide_has() {{ [[ " $1 " == *" $2 "* ]]; }}

_bide() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev="" cmd="" word i skip=0
    (( COMP_CWORD > 1 )) && prev=${{COMP_WORDS[COMP_CWORD-1]}}
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word=${{COMP_WORDS[i]}}
        if (( skip )); then skip=0; continue; fi
        if [[ $word == -* ]]; then
            [[ $word != *=* ]] && _bide_has "$(_bide_takes_value "$cmd")" "$word" && skip=1
            continue
        fi
        _bide_has "$(_bide_subcommands "$cmd")" "$word" && cmd="${{cmd:+$cmd }}$word"
    done
    if (( skip )); then
        local values; values=$(_bide_choices "$cmd" "$prev")
        [[ -n $values ]] && COMPREPLY=($(compgen -W "$values" -- "$cur"))
        return 0
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_bide_options "$cmd")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_bide_subcommands "$cmd") $(_bide_choices "$cmd")" -- "$cur"))
    fi
    return 0
}}

complete -o bashdefault -o default -F _bide bide
"""

_ZSH = """\
#compdef bide
# zsh completion for bide, generated from its parser by `bide completion zsh`.
# Install: bide completion zsh > ~/.zfunc/_bide, and in ~/.zshrc (before compinit):
#   fpath=(~/.zfunc $fpath); autoload -Uz compinit && compinit
{tables}
_bide_has() {{ [[ " $1 " == *" $2 "* ]]; }}

_bide() {{
    local cur=${{words[CURRENT]}} prev=${{words[CURRENT-1]}} cmd="" word i skip=0
    for (( i = 2; i < CURRENT; i++ )); do
        word=${{words[i]}}
        if (( skip )); then skip=0; continue; fi
        if [[ $word == -* ]]; then
            [[ $word != *=* ]] && _bide_has "$(_bide_takes_value "$cmd")" "$word" && skip=1
            continue
        fi
        _bide_has "$(_bide_subcommands "$cmd")" "$word" && cmd="${{cmd:+$cmd }}$word"
    done
    local -a candidates
    if (( skip )); then
        candidates=(${{=$(_bide_choices "$cmd" "$prev")}})
        if (( ${{#candidates}} )); then compadd -- $candidates; else _files; fi
        return
    fi
    if [[ $cur == -* ]]; then
        candidates=(${{=$(_bide_options "$cmd")}})
        compadd -- $candidates
        return
    fi
    candidates=(${{=$(_bide_subcommands "$cmd")}} ${{=$(_bide_choices "$cmd")}})
    if (( ${{#candidates}} )); then compadd -- $candidates; else _files; fi
}}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _bide "$@"
elif (( $+functions[compdef] )); then
    compdef _bide bide
fi
"""


def bash_script(parser: argparse.ArgumentParser) -> str:
    return _BASH.format(tables=_tables(grammar_of(parser)))


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return _ZSH.format(tables=_tables(grammar_of(parser)))

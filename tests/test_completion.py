"""`bide --version`, and `bide completion bash|zsh` sourced in the real shells: the scripts
complete what the parser has, including an option added without touching the generator."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.completion import bash_script

BIDE = [sys.executable, "-m", "daemon.cli"]


def bide(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BIDE, *args], capture_output=True, text=True, timeout=60, check=False)


def test_version_prints_the_release() -> None:
    out = bide("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"bide {importlib.metadata.version('bide')}"


def bash_complete(script: Path, *words: str) -> list[str]:
    """What bash offers for ``words`` (the last one being typed), through the function the
    script registered with ``complete`` for ``bide``."""
    program = f"""
        source {script}
        spec=$(complete -p bide)
        function=${{spec##*-F }}; function=${{function%% *}}
        COMP_WORDS=({" ".join(f"'{w}'" for w in words)})
        COMP_CWORD={len(words) - 1}
        "$function"
        printf '%s\\n' "${{COMPREPLY[@]}}"
    """
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def bash_completion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    out = bide("completion", "bash")
    assert out.returncode == 0, out.stderr
    script = tmp_path_factory.mktemp("completion") / "bide.bash"
    script.write_text(out.stdout)
    return script


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (("bide", "ver"), ["verify"]),
        (("bide", "verify", "--exp"), ["--expect-signer"]),
        (("bide", "--ver"), ["--version"]),
        (("bide", "log", "h"), ["head"]),
        (("bide", "status", "--phase", ""), ["live", "succeeded", "escalated", "closed"]),
        (("bide", "completion", ""), ["bash", "zsh"]),
        (("bide", "story", "--config", "verify", "--j"), ["--json"]),  # a value, not a command
    ],
)
def test_bash_completes_commands_options_and_choices(
    bash_completion: Path, words: tuple[str, ...], offered: list[str]
) -> None:
    assert sorted(bash_complete(bash_completion, *words)) == sorted(offered)


def test_bash_leaves_a_file_argument_to_filename_completion(bash_completion: Path) -> None:
    assert bash_complete(bash_completion, "bide", "verify", "--verify-key", "") == []
    assert "complete -o bashdefault -o default -F" in bash_completion.read_text()


def test_a_new_option_is_completed_without_editing_the_generator(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="bide")
    sub = parser.add_subparsers(dest="command")
    brand_new = sub.add_parser("brand-new")
    brand_new.add_argument("--colour", choices=["red", "green"])
    script = tmp_path / "bide.bash"
    script.write_text(bash_script(parser))
    assert bash_complete(script, "bide", "bra") == ["brand-new"]
    assert bash_complete(script, "bide", "brand-new", "--col") == ["--colour"]
    assert bash_complete(script, "bide", "brand-new", "--colour", "g") == ["green"]


ZSH_HARNESS = """
source {script}
# compadd only runs inside a completion widget: this stand-in prints what would be offered
# that starts with the word being typed, as zsh's own matching would.
compadd() {{
    [[ $1 == -- ]] && shift
    local c; for c; do [[ $c == ${{words[CURRENT]}}* ]] && print -r -- $c; done; return 0
}}
_files() {{ print -r -- '<files>'; }}
words=({words}); CURRENT=${{#words}}
_bide
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here")
@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (("bide", "ver"), ["verify"]),
        (("bide", "verify", "--exp"), ["--expect-signer"]),
        (("bide", "status", "--phase", ""), ["live", "succeeded", "escalated", "closed"]),
        (("bide", "verify", "--verify-key", ""), ["<files>"]),
    ],
)
def test_zsh_completes_commands_options_and_choices(
    tmp_path: Path, words: tuple[str, ...], offered: list[str]
) -> None:
    out = bide("completion", "zsh")
    assert out.returncode == 0, out.stderr
    script = tmp_path / "_bide"
    script.write_text(out.stdout)
    quoted = " ".join(f"'{w}'" for w in words)
    run = subprocess.run(
        ["zsh", "-f", "-c", ZSH_HARNESS.format(script=script, words=quoted)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.split()) == sorted(offered)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here")
def test_zsh_registers_the_function_with_compinit(tmp_path: Path) -> None:
    out = bide("completion", "zsh")
    (tmp_path / "_bide").write_text(out.stdout)
    run = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            f"fpath=({tmp_path} $fpath); autoload -Uz compinit && compinit -u -d "
            f"{tmp_path}/zcompdump; print -r -- ${{_comps[bide]}}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "_bide"


def test_the_help_says_how_to_install_it() -> None:
    out = bide("completion", "--help")
    assert out.returncode == 0
    assert "bide completion bash > ~/.local/share/bash-completion/completions/bide" in out.stdout
    assert re.search(r"~/\.zfunc/_bide", out.stdout)

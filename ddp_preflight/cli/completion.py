"""`ddp-preflight --completion bash`: a bash completion script, made from the commands' own
parsers and tables (options, check ids, lab commands and faults), so it cannot drift from them.
    eval "$(ddp-preflight --completion bash)"      # in ~/.bashrc"""

from __future__ import annotations

import argparse
import sys

SCRIPT = r"""# bash completion for ddp-preflight (eval "$(ddp-preflight --completion bash)")
_ddp_preflight() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    COMPREPLY=()
    case $prev in
        --only)
            if [[ $cur == *,* ]]; then
                COMPREPLY=($(compgen -P "${cur%,*}," -W "@CHECKS@" -- "${cur##*,}"))
            else
                COMPREPLY=($(compgen -W "@CHECKS@" -- "$cur"))
            fi
            return;;
        --backend) COMPREPLY=($(compgen -W "gloo nccl" -- "$cur")); return;;
        --device) COMPREPLY=($(compgen -W "cpu cuda" -- "$cur")); return;;
        --fault) compopt -o nospace 2>/dev/null; COMPREPLY=($(compgen -S @ -W "@FAULTS@" -- "$cur")); return;;
        @FILES@) COMPREPLY=($(compgen -f -- "$cur")); return;;
    esac
    case ${COMP_WORDS[1]} in
        lab)
            if [[ $COMP_CWORD -eq 2 ]]; then
                COMPREPLY=($(compgen -W "@LAB@" -- "$cur"))
            elif [[ $cur == -* ]]; then
                case ${COMP_WORDS[2]} in
@LABOPTIONS@
                esac
            elif [[ ${COMP_WORDS[2]} == fault && $COMP_CWORD -eq 3 ]]; then
                COMPREPLY=($(compgen -W "add clear" -- "$cur"))
            elif [[ ${COMP_WORDS[2]} == fault ]]; then
                compopt -o nospace 2>/dev/null; COMPREPLY=($(compgen -S @ -W "@FAULTS@" -- "$cur"))
            fi
            return;;
        explain) COMPREPLY=($(compgen -W "--json" -- "$cur") $(compgen -f -- "$cur")); return;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "@OPTIONS@" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "lab explain" -- "$cur") $(compgen -A hostname -- "$cur"))
    fi
}
complete -F _ddp_preflight ddp-preflight
_hangwatch() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    COMPREPLY=()
    case $prev in
        --ssh-config|--python|--incident-dir) COMPREPLY=($(compgen -f -- "$cur")); return;;
    esac
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "attach --help --version" -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "@HANGWATCH@" -- "$cur"))
    else
        COMPREPLY=($(compgen -A hostname -- "$cur"))
    fi
}
complete -F _hangwatch hangwatch
"""
# Options whose value is a file or a folder.
FILE_OPTIONS = ("--hostfile", "--config", "--ssh-config", "--python", "--data-dir", "--code-dir", "--scan",
                "--junit", "--log-dir", "--log_dir")


def bash(parser: argparse.ArgumentParser) -> str:
    from ddp_preflight.lab.faults import FAULTS
    from ddp_preflight.preflight.checks import CHECKS

    from .hangwatch import _parser as hangwatch_parser
    from .lab import _parser as lab_parser

    def options_of(p: argparse.ArgumentParser) -> str:
        return " ".join(o for action in p._actions for o in action.option_strings)

    def commands_of(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices

    options = [o for action in parser._actions for o in action.option_strings]
    lab_commands = commands_of(lab_parser())
    lab_options = "\n".join(f'                    {name}) COMPREPLY=($(compgen -W "{options_of(p)}" -- "$cur"));;'
                            for name, p in lab_commands.items())
    return (SCRIPT.replace("@CHECKS@", " ".join(c.id for c in CHECKS)).replace("@FAULTS@", " ".join(FAULTS))
            .replace("@LAB@", " ".join(lab_commands)).replace("@OPTIONS@", " ".join(options))
            .replace("@LABOPTIONS@", lab_options)
            .replace("@HANGWATCH@", options_of(commands_of(hangwatch_parser())["attach"]))
            .replace("@FILES@", "|".join(o for o in FILE_OPTIONS if o in options)))


class Completion(argparse.Action):
    """--completion SHELL: prints the script and exits, as --version does."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            sys.stdout.write(bash(parser))
            sys.stdout.flush()
        except BrokenPipeError:        # `... --completion bash | head`
            from .exit import reader_gone
            parser.exit(reader_gone())
        parser.exit()

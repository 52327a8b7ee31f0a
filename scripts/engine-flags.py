#!/usr/bin/env python3
"""Print an engine server's flag table for engines/external/src/flags/: one `--flag kind` line per
long option of the server's own argument parser, kind being switch (store_true), bool
(--x / --no-x), list (nargs + or *) or value.

usage: engine-flags.py vllm|sglang > engines/external/src/flags/<engine>-<version>.txt
Needs the engine installed (its parser is built without starting anything).
"""
import argparse
import sys


def parser(engine: str) -> argparse.ArgumentParser:
    if engine == "vllm":
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return make_arg_parser(FlexibleArgumentParser())
    if engine == "sglang":
        from sglang.srt.server_args import ServerArgs

        p = argparse.ArgumentParser()
        ServerArgs.add_cli_args(p)
        return p
    sys.exit(f"unknown engine {engine!r}: vllm or sglang")


def kind(action: argparse.Action) -> str:
    name = type(action).__name__
    if "StoreTrue" in name or "StoreFalse" in name:
        return "switch"
    if "BooleanOptional" in name:
        return "bool"
    if action.nargs in ("+", "*"):
        return "list"
    return "value"


def main() -> None:
    engine = sys.argv[1] if len(sys.argv) > 1 else ""
    p = parser(engine)
    seen = set()
    for action in p._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help" and flag not in seen:
                seen.add(flag)
                print(flag, kind(action))


if __name__ == "__main__":
    main()

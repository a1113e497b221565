"""``jupyter-mesh``: the command line.

jupyter-mesh agent      run a host agent (configuration as one JSON line on stdin)
jupyter-mesh demo       run the local 4-proc demo
jupyter-mesh status     the meshes of the running Jupyter kernels (named by notebook), even busy ones; --all
jupyter-mesh install-kernel [--user | --sys-prefix | --prefix P]   install the `mesh` kernelspec
jupyter-mesh version
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter-mesh", description="Drive meshes of processes from one program.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("agent", help="run a host agent; reads its JSON configuration (with the session key) on stdin")
    sub.add_parser("demo", help="run the local 4-proc demo")
    st = sub.add_parser("status", help="show the meshes of running Jupyter kernels (or of given connection files)")
    st.add_argument("connection_file", nargs="*", help="kernel connection files (default: every running kernel)")
    st.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each kernel (default 3)")
    st.add_argument(
        "--all", action="store_true", help="also list kernels without a mesh (and those that do not answer)"
    )
    sub.add_parser("version", help="print the version")
    ik = sub.add_parser("install-kernel", help="install the `mesh` Jupyter kernelspec (pip install already does)")
    where = ik.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true", help="in this environment (the default)")
    where.add_argument("--prefix", help="under another prefix")
    args = parser.parse_args(argv)
    if args.cmd == "agent":
        from ._runtime.agent import main as agent_main

        agent_main()
    elif args.cmd == "demo":
        from .demo import main as demo_main

        demo_main()
    elif args.cmd == "install-kernel":
        from .notebook.install import install_kernel

        print(install_kernel(user=args.user, prefix=args.prefix or (None if args.user else sys.prefix)))
    elif args.cmd == "status":
        from .ui.remote import status_main

        return status_main(args.connection_file or None, args.timeout, show_all=args.all)
    elif args.cmd == "version":
        from ._version import __version__

        print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())

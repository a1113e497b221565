"""``jupyter-mesh``: the command line.

jupyter-mesh agent      run a host agent: --controller ADDR --key-file F (dial back, under a scheduler),
                        --listen tcp://IP:PORT (wait for attach_to_workers), or a JSON line on stdin
jupyter-mesh keygen     make the mesh key (~/.jupyter_mesh/mesh.key) agents started by hand admit
jupyter-mesh demo       run the local 4-proc demo
jupyter-mesh status     the meshes of the running Jupyter kernels (named by notebook), even busy ones; --all
jupyter-mesh debug      actors paused in breakpoint() in a running kernel or script: list, attach, cast, continue
jupyter-mesh install-kernel [--user | --sys-prefix | --prefix P]   install the `mesh` kernelspec
jupyter-mesh version
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter-mesh", description="Drive meshes of processes from one program.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ag = sub.add_parser(
        "agent",
        help="run a host agent: dial back to a controller, listen to be attached, or (no options) read a "
        "JSON configuration line on stdin",
    )
    mode = ag.add_mutually_exclusive_group()
    mode.add_argument("--controller", help="dial back to this controller (tcp://IP:PORT); needs --key-file")
    mode.add_argument("--listen", help="wait at tcp://IP:PORT for a controller holding the mesh key to attach")
    ag.add_argument(
        "--key-file",
        help="the job's key file (--controller) or the mesh key (--listen; default "
        "~/.jupyter_mesh/mesh.key); mode 0600",
    )
    ag.add_argument("--bind", help="the IP to listen on and advertise (default: the one routing to the controller)")
    ag.add_argument("--host-index", type=int, help="this host's index in its job (default: $SLURM_PROCID)")
    ag.add_argument("--once", action="store_true", help="--listen: exit after one session")
    kg = sub.add_parser("keygen", help="make the mesh key that agents started with --listen admit")
    kg.add_argument("path", nargs="?", help="where (default ~/.jupyter_mesh/mesh.key)")
    kg.add_argument("--force", action="store_true", help="replace an existing key")
    sub.add_parser("demo", help="run the local 4-proc demo")
    st = sub.add_parser("status", help="show the meshes of running Jupyter kernels (or of given connection files)")
    st.add_argument("connection_file", nargs="*", help="kernel connection files (default: every running kernel)")
    st.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each kernel (default 3)")
    st.add_argument(
        "--all", action="store_true", help="also list kernels without a mesh (and those that do not answer)"
    )
    db = sub.add_parser(
        "debug",
        help="attach to actors paused in breakpoint() in a running kernel or script of this user on this host",
        description="Commands: list | attach ACTOR RANK | cast ACTOR RANKS CMD (RANKS: ranks(1,4), "
        "ranks(dp=1:3), gpus=0:4) | continue [ACTOR [RANKS]] | quit. With a COMMAND: run it and exit.",
    )
    db.add_argument("--pid", type=int, help="the controller's process (when several run)")
    db.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each controller (default 3)")
    db.add_argument("command", nargs=argparse.REMAINDER, help="one command to run, e.g. list")
    sub.add_parser("version", help="print the version")
    ik = sub.add_parser("install-kernel", help="install the `mesh` Jupyter kernelspec (pip install already does)")
    where = ik.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true", help="in this environment (the default)")
    where.add_argument("--prefix", help="under another prefix")
    args = parser.parse_args(argv)
    if args.cmd == "agent":
        from ._runtime import agent_boot

        if args.controller and not args.key_file:
            parser.error("--controller needs --key-file (the key never goes on a command line)")
        try:
            if args.listen:
                return agent_boot.listen(args.listen, args.key_file, once=args.once)
            if args.controller or args.key_file:
                agent_boot.dial_back(args.controller, args.key_file, args.bind, args.host_index)
        except (OSError, ValueError) as e:  # a key file refused, an address that is not ours: say why
            sys.exit(f"jupyter-mesh agent: {e}")
        except Exception as e:
            if type(e).__module__.startswith("zmq"):
                sys.exit(f"jupyter-mesh agent: {e}")
            raise
        agent_boot.main()
    elif args.cmd == "keygen":
        from ._wire.keyfile import new_mesh_key

        print(new_mesh_key(args.path, overwrite=args.force))
    elif args.cmd == "demo":
        from .demo import main as demo_main

        demo_main()
    elif args.cmd == "install-kernel":
        from .notebook.install import install_kernel

        print(install_kernel(user=args.user, prefix=args.prefix or (None if args.user else sys.prefix)))
    elif args.cmd == "status":
        from .ui.remote import status_main

        return status_main(args.connection_file or None, args.timeout, show_all=args.all)
    elif args.cmd == "debug":
        from .ui.debug_terminal import main as debug_main

        return debug_main(args.pid, args.command or None, args.timeout)
    elif args.cmd == "version":
        from ._version import __version__

        print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())

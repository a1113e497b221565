#!/bin/sh
# Refreshes the README's screenshots (docs/*.png) from the current UI: runs the browser tests
# (tests/ui: a real JupyterLab in Debian's Chromium, the sidebar built in this checkout), which write
# every screenshot they take to $JUPYTER_MESH_SCREENSHOTS, then keeps the ones the README shows.
# The sidebar is the one built in jupyter_mesh/labextension (`npm run build:prod` after changing it).
# Fails, leaving docs/ as it was, if a test fails or a picture is over 150 KB.
#   make screenshots     (or: sh docs/screenshots.sh; PYTHON=path/to/python to choose the interpreter)
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
README_SHOTS="sidebar-widget.png hosts.png progress-2-of-4.png run-all-snapshots.png value-mesh.png debug-attach.png"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
JUPYTER_MESH_SCREENSHOTS="$out" UCX_TLS=tcp,self "$PYTHON" -m pytest -q -p no:cacheprovider tests/ui
for f in $README_SHOTS; do
    size=$(wc -c <"$out/$f")
    if [ "$size" -gt 153600 ]; then
        echo "$f is $size bytes (over 150 KB): crop it further in its test" >&2
        exit 1
    fi
done
for f in $README_SHOTS; do
    cp "$out/$f" docs/
done
ls -l $(for f in $README_SHOTS; do echo "docs/$f"; done)

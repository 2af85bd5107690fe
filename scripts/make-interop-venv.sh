#!/usr/bin/env bash
# Create the Python 3.12 virtual environment that holds the open-source osmosis-ai SDK.
#
#   scripts/make-interop-venv.sh [DIR]      # DIR defaults to <repo>/.venv-interop
#
# The conformance suite (tests/conformance) runs its osmosis-ai flavour with DIR/bin/python.
# Running the script again is cheap: it does nothing when the pinned version is installed.
set -euo pipefail
# Importing litellm (to prove it installed) must not fetch its price list from GitHub.
export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true

readonly PACKAGE="osmosis-ai"
readonly VERSION="0.3.8"
# `eval`: the official CLI's own `eval run` (tests/platform/test_official_run_layout.py) needs
# its LiteLLM bridge.
readonly REQUIREMENT="${PACKAGE}[server,eval]==${VERSION}"
readonly PY_MINOR="3.12"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${1:-${repo_root}/.venv-interop}"

die() {
    echo "make-interop-venv: error: $*" >&2
    exit 1
}

say() {
    echo "make-interop-venv: $*"
}

# Print the interpreter's "major.minor", or nothing when it does not run.
python_minor() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# Print the installed osmosis-ai version inside a venv, or nothing.
installed_version() {
    "$1" -c 'import importlib.metadata as m; print(m.version("osmosis-ai"))' 2>/dev/null || true
}

# Print a Python 3.12 interpreter path, trying pyenv, then PATH, then uv (never downloading).
find_python312() {
    local candidate prefix uv_bin
    if command -v pyenv >/dev/null 2>&1; then
        # `pyenv prefix 3.12` fails when 3.12 is not installed; that is not fatal here.
        if prefix="$(pyenv prefix "${PY_MINOR}" 2>/dev/null)"; then
            for candidate in "${prefix}/bin/python${PY_MINOR}" "${prefix}/bin/python3"; do
                if [[ -x "${candidate}" && "$(python_minor "${candidate}")" == "${PY_MINOR}" ]]; then
                    echo "${candidate}"
                    return 0
                fi
            done
        fi
    fi
    if candidate="$(command -v "python${PY_MINOR}" 2>/dev/null)" \
        && [[ "$(python_minor "${candidate}")" == "${PY_MINOR}" ]]; then
        echo "${candidate}"
        return 0
    fi
    uv_bin="$(command -v uv 2>/dev/null || true)"
    if [[ -z "${uv_bin}" && -x "${repo_root}/.venv/bin/uv" ]]; then
        uv_bin="${repo_root}/.venv/bin/uv"
    fi
    if [[ -n "${uv_bin}" ]] \
        && candidate="$(UV_PYTHON_DOWNLOADS=never "${uv_bin}" python find "${PY_MINOR}" 2>/dev/null)" \
        && [[ "$(python_minor "${candidate}")" == "${PY_MINOR}" ]]; then
        echo "${candidate}"
        return 0
    fi
    return 1
}

venv_python="${venv_dir}/bin/python"

if [[ -x "${venv_python}" ]]; then
    existing_minor="$(python_minor "${venv_python}")"
    if [[ "${existing_minor}" != "${PY_MINOR}" ]]; then
        die "${venv_dir} exists but its Python is '${existing_minor:-unusable}', not ${PY_MINOR}; remove it and run again"
    fi
    if [[ "$(installed_version "${venv_python}")" == "${VERSION}" ]] \
        && "${venv_python}" -c 'import litellm' 2>/dev/null; then
        say "${PACKAGE} ${VERSION} is already installed in ${venv_dir}"
        exit 0
    fi
elif [[ -e "${venv_dir}" ]]; then
    die "${venv_dir} exists but is not a virtual environment (no bin/python); remove it and run again"
else
    python312="$(find_python312)" \
        || die "no Python ${PY_MINOR} interpreter found (tried 'pyenv prefix ${PY_MINOR}', 'python${PY_MINOR}' on PATH, 'uv python find ${PY_MINOR}'); install one, e.g. 'pyenv install ${PY_MINOR}'"
    say "creating ${venv_dir} with ${python312}"
    "${python312}" -m venv "${venv_dir}" || die "could not create a virtual environment at ${venv_dir}"
fi

say "installing ${REQUIREMENT} into ${venv_dir}"
"${venv_python}" -m pip install --quiet --disable-pip-version-check "${REQUIREMENT}" \
    || die "pip could not install ${REQUIREMENT} (is PyPI reachable?)"

# The suite needs the rollout SDK and its server extra; prove both import.
"${venv_python}" -c 'from osmosis_ai.rollout import LocalBackend; from osmosis_ai.rollout.server import create_rollout_server; import uvicorn, litellm' \
    || die "${REQUIREMENT} installed but osmosis_ai.rollout or its server extra does not import"

got="$(installed_version "${venv_python}")"
[[ "${got}" == "${VERSION}" ]] || die "expected ${PACKAGE} ${VERSION} in ${venv_dir}, found '${got}'"
say "ready: ${venv_python} (${PACKAGE} ${VERSION})"

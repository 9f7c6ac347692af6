#!/usr/bin/env bash
# Installs the Python packages for the Hugging Face checks (numpy and
# safetensors read the exported files, tokenizers trains subword
# vocabularies: scripts/tokenizer.py) for the python3 on PATH; the checks
# skip without them. transformers (and torch) are optional: with them the
# interop test also loads the exports in LlamaForCausalLM and saves fresh
# models.
#   scripts/python_deps.sh              # numpy, safetensors, tokenizers
#   scripts/python_deps.sh transformers # also torch (CPU) and transformers
set -euo pipefail
pkgs=(numpy safetensors tokenizers)
mods="numpy, safetensors, tokenizers"
if [ "${1:-}" = transformers ]; then pkgs+=(torch transformers); mods+=", torch, transformers"; fi
python3 -c "import $mods" 2>/dev/null && exit 0
if ! python3 -m pip --version >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  else
    echo "tessera: python3 has no pip; install python3-pip, then rerun $0" >&2
    exit 2
  fi
fi
echo "tessera: installing ${pkgs[*]} for $(command -v python3)"
# Debian's own python3 refuses pip installs outside a virtual environment
# unless told (PEP 668); other pythons (pyenv, venv) take them as they are.
python3 -m pip install --quiet --disable-pip-version-check "${pkgs[@]}" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "${pkgs[@]}"
python3 -c "import $mods"

#!/usr/bin/env bash
# Installs the Debian packages tilegrad needs when they are missing, saying what it installs.
# Usage: tools/install_deps.sh [extra-package …]
set -euo pipefail
packages=(cmake g++ make libopenblas-dev libyaml-cpp-dev libhdf5-dev libgtest-dev libomp-dev nlohmann-json3-dev libicu-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tilegrad: installing missing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # A machine without a reachable package registry (an air-gapped GPU box) keeps going with what
  # it has: the build or the next step then names exactly what is missing.
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
           --no-install-recommends "${missing[@]}"; }; then
    echo "tilegrad: warning: could not install ${missing[*]} (no package registry?); continuing with what is installed" >&2
  fi
fi

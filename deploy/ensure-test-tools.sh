#!/usr/bin/env bash
# Make sure the interop test peers are installed (tests/interop): sipp (Debian sip-tester),
# baresip (baresip-core), espeak-ng and sox, and Chromium for the softphone tests (tests/browser), and
# Kamailio (kamailio: the dispatcher front of tests/interop/test_kamailio.py, kamcmd with it). Installs with apt-get only what is missing; quiet
# and idempotent. Without root (or sudo) it only warns: the interop tests then skip.
set -euo pipefail
declare -A pkg_of=([sipp]=sip-tester [baresip]=baresip-core [espeak-ng]=espeak-ng [sox]=sox [chromium]=chromium [kamailio]=kamailio)
missing=()
for tool in sipp baresip espeak-ng sox chromium kamailio; do
  # kamailio and kamcmd live in /usr/sbin, not on every user's PATH.
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("${pkg_of[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    echo "ensure-test-tools: missing ${missing[*]} and no root to install them; interop tests will skip" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-test-tools: missing ${missing[*]} and no apt-get; interop tests will skip" >&2
  exit 0
fi
install() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
# The package lists may be absent or stale: update once, only when the install needs it.
if ! install 2>/dev/null; then
  $sudo apt-get update -qq >/dev/null
  install
fi
# Debian's package enables and starts a system kamailio on 5060 with its sample config; the tests
# run their own in the foreground, and 5060 belongs to `make serve`: no system service.
if [[ " ${missing[*]} " == *" kamailio "* ]] && command -v systemctl >/dev/null 2>&1 \
    && [ -d /run/systemd/system ]; then
  $sudo systemctl disable --now kamailio.service >/dev/null 2>&1 || true
fi

#!/bin/sh
# Debian's chromium for the test that renders the HTML reports in a real browser
# (tests/test_report.py), installed by `make setup` when missing and this machine can (root,
# apt-get); elsewhere nothing is done and that test skips. Never fails the set-up.
BROWSER=/usr/bin/chromium
[ -x "$BROWSER" ] && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || exit 0
export DEBIAN_FRONTEND=noninteractive
echo "installing Debian's chromium (for the browser test)…"
# a fresh machine may have no package lists yet
apt-get install -y -q chromium >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
  || echo "apt-get install chromium failed: the browser test will skip" >&2
exit 0

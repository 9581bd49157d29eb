#!/usr/bin/env bash
# The Debian packages the lab and the tests use. Installs only what is missing; needs root.
set -euo pipefail
declare -A need=(
  [ip]=iproute2 [tc]=iproute2 [nft]=nftables [unshare]=util-linux [setpriv]=util-linux
  [ssh]=openssh-client [ssh-keygen]=openssh-client [/usr/sbin/sshd]=openssh-server
  [ss]=iproute2 [nstat]=iproute2 [getent]=libc-bin [b3sum]=b3sum [xxhsum]=xxhash [tmux]=tmux
  [/usr/bin/python3]=python3-minimal   # a Python any user may run (tests drop to nobody)
  # `lab up --slurm`: a real Slurm (22.05 on Debian 12) and its authentication
  [/usr/sbin/slurmctld]=slurm-wlm [/usr/sbin/slurmd]=slurm-wlm [srun]=slurm-wlm
  [/usr/sbin/munged]=munge
  [/usr/sbin/useradd]=passwd          # the hostile-user tests make a second, unprivileged user
  [/usr/sbin/sysctl]=procps [pgrep]=procps   # the lab keeps IPv6 addresses across link down (sysctl)
)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
# A node whose wall clock is behind (tests/lab/test_hangwatch_lab.py): libfaketime, preloaded.
compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || missing+=(libfaketime)
# `python3 -m venv` (make setup) needs ensurepip, which Debian ships apart from python3.
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: $pkgs; install them as root: apt-get install $pkgs" >&2
  exit 1
fi
echo "installing Debian packages: $pkgs"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $pkgs >/dev/null

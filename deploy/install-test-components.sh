#!/usr/bin/env bash
# Installs the real components pko's tests, loadtest and dev environment run against:
#   kube-apiserver, kube-controller-manager, kubectl   built from k8s.io/kubernetes through the Go module proxy
#   the same two servers at the floor version          (with --with-floor: the oldest Kubernetes pko supports,
#                                                       for .ci/run's compatibility subset)
#   etcd, nats-server                                  built from their Go modules through the proxy
#   docker-registry, skopeo, prometheus, promtool, faketime   (Debian packages)
#
# Idempotent. Each build is cached under ${XDG_CACHE_HOME:-$HOME/.cache}/pko/<component>-<version>-<recipe>/,
# so a second run only verifies what is there; a new version is a new directory. The directories the
# harness reads are `platform/` (the current version) and `platform-floor/` (the floor version): symlinks
# to the cached binaries, rewritten on every run. Prints each step; stops with a message naming the
# failed step.
#
# Environment:
#   PKO_CACHE_DIR            cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/pko)
#   PKO_KUBE_VERSION         Kubernetes of platform/ (default below)
#   PKO_KUBE_FLOOR_VERSION   Kubernetes of platform-floor/ (default below), built with --with-floor
#   PKO_ETCD_VERSION, PKO_NATS_VERSION   etcd and nats-server versions (defaults below)
set -euo pipefail

with_floor=0
for arg in "$@"; do
  case $arg in
    --with-floor) with_floor=1 ;;
    *) printf 'usage: %s [--with-floor]\n' "$0" >&2; exit 2 ;;
  esac
done

# The newest patch of the newest minor that builds with the machine's Go (1.26): 1.37's go.mod asks for
# go 1.26.0. The floor is the oldest minor OpenShift-based HyperShift still runs on (4.14 = 1.27) that the
# module proxy serves and Go 1.26 builds; docs/operations.md states the range.
KUBE_VERSION=${PKO_KUBE_VERSION:-v1.37.2}
KUBE_FLOOR_VERSION=${PKO_KUBE_FLOOR_VERSION:-v1.27.16}
# etcd 3.6 is what Kubernetes 1.34+ is released with; it serves 1.27's client as well.
ETCD_VERSION=${PKO_ETCD_VERSION:-v3.6.16}
NATS_VERSION=${PKO_NATS_VERSION:-v2.12.15}
# Bumped whenever a build recipe below changes, so a cached build of an older recipe is rebuilt.
RECIPE=go1
CACHE_DIR=${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}
DEB_PACKAGES=(docker-registry skopeo prometheus faketime)
# The module proxy's Go, never a toolchain download: every module above builds with the machine's Go.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
export GOCACHE=$CACHE_DIR/go-build-cache

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf '\nerror: %s\n' "$*" >&2; exit 1; }
current_step=""
work=""
trap 'rc=$?; [ -z "$work" ] || rm -rf "$work"; [ $rc -eq 0 ] || printf "\nerror: step failed (exit %s): %s\n" "$rc" "$current_step" >&2' EXIT

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "not root and no sudo: cannot install Debian packages"
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive

have_all_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
  done
}

install_packages() {
  if have_all_packages "$@"; then
    info "already installed: $*"
    return
  fi
  current_step="apt-get update"
  $SUDO apt-get update -qq || die "apt-get update failed (is a Debian mirror reachable?)"
  current_step="apt-get install $*"
  info "apt-get install $*"
  # Debian's postinst scripts try to start the registry as a service; pko never uses that instance (it
  # starts its own on free ports), so service starts are suppressed for the install.
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee $policy >/dev/null && $SUDO chmod +x $policy && created_policy=1
  fi
  local rc=0
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  [ $created_policy -eq 1 ] && $SUDO rm -f $policy
  [ $rc -eq 0 ] || die "apt-get install failed for: $*"
}

# A throwaway module in $work that requires `$1` (module@version) and names the programs to build in a
# tools file, so that `go mod tidy` resolves exactly their dependencies.
throwaway_module() {
  local requirement=$1
  shift
  work=$(mktemp -d "${TMPDIR:-/tmp}/pko-build.XXXXXX")
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local program
    for program in "$@"; do printf '\t_ "%s"\n' "$program"; done
    printf ')\n'
  } >"$work/tools.go"
  (cd "$work" && go mod init pko.invalid/build >/dev/null 2>&1 && go mod edit -require="$requirement")
}

# `go build` of the programs into directory $1 with ldflags $2, as file $3 when it names one (a single
# program whose import path ends in a major version, `/v3`); the build log's tail on failure.
build_programs() {
  local out=$1 ldflags=$2 name=$3
  shift 3
  mkdir -p "$out.partial"
  # The checksum database has answered 404 for a module it serves a minute later (seen for
  # k8s.io/legacy-cloud-providers v0.27.16): resolving is tried a second time before the build fails.
  if ! (cd "$work" && go mod tidy >"$work/build.log" 2>&1); then
    info "resolving the modules failed ($(grep -m1 -o 'verifying module: [^:]*' "$work/build.log" || echo 'see the log')); once more"
    (cd "$work" && go mod tidy >"$work/build.log" 2>&1) || { tail -n 30 "$work/build.log" >&2; die "$current_step failed (last lines above)"; }
  fi
  if ! (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$out.partial/$name" "$@" >>"$work/build.log" 2>&1); then
    tail -n 30 "$work/build.log" >&2
    die "$current_step failed (last lines above)"
  fi
  rm -rf "$out" && mv "$out.partial" "$out"
  touch "$out/.complete"
  rm -rf "$work"
  work=""
}

# kube-apiserver, kube-controller-manager (and kubectl unless $3 is `servers`) of Kubernetes $1 into $2.
build_kubernetes() {
  local version=$1 out=$2 which=${3:-all}
  local programs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
  [ "$which" = servers ] || programs+=(k8s.io/kubernetes/cmd/kubectl)
  if [ -f "$out/.complete" ]; then
    info "cached in $out"
    return
  fi
  current_step="download k8s.io/kubernetes@$version"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$gomod" ] || die "the module proxy did not serve k8s.io/kubernetes@$version"
  throwaway_module "k8s.io/kubernetes@$version" "${programs[@]}"
  # The kubernetes module points each k8s.io staging module at its own tree (./staging/...), which a
  # module download lacks; the same code is published as k8s.io/<module> v0.<minor>.<patch>.
  local staging=v0.${version#v1.} module
  for module in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"); do
    (cd "$work" && go mod edit -replace="$module=$module@$staging")
  done
  local minor=${version#v1.}
  minor=${minor%%.*}
  local ldflags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  current_step="build Kubernetes $version (${programs[*]##*/})"
  info "go build ${programs[*]##*/} (several minutes)"
  local b0
  b0=$(date +%s)
  build_programs "$out" "$ldflags" "" "${programs[@]}"
  info "built in $(( $(date +%s) - b0 ))s into $out"
}

build_etcd() {
  local out=$CACHE_DIR/etcd-$ETCD_VERSION-$RECIPE
  if [ -f "$out/.complete" ]; then
    info "cached in $out"
    return
  fi
  current_step="build etcd $ETCD_VERSION"
  # The server module is etcd's main package; its own go.mod replaces its siblings with ../ paths, which
  # a throwaway module's requirement ignores (the published siblings of the same version are used).
  throwaway_module "go.etcd.io/etcd/server/v3@$ETCD_VERSION" go.etcd.io/etcd/server/v3
  local b0
  b0=$(date +%s)
  build_programs "$out" "-s -w" etcd go.etcd.io/etcd/server/v3
  info "built in $(( $(date +%s) - b0 ))s into $out"
}

build_nats() {
  local out=$CACHE_DIR/nats-server-$NATS_VERSION-$RECIPE
  if [ -f "$out/.complete" ]; then
    info "cached in $out"
    return
  fi
  current_step="build nats-server $NATS_VERSION"
  throwaway_module "github.com/nats-io/nats-server/v2@$NATS_VERSION" github.com/nats-io/nats-server/v2
  local b0
  b0=$(date +%s)
  build_programs "$out" "-s -w" nats-server github.com/nats-io/nats-server/v2
  info "built in $(( $(date +%s) - b0 ))s into $out"
}

# Points $1/<name> at each given binary.
link_platform() {
  local dir=$1
  shift
  rm -rf "$dir"
  mkdir -p "$dir"
  local binary
  for binary in "$@"; do
    [ -x "$binary" ] || die "$binary is missing or not executable"
    ln -s "$binary" "$dir/$(basename "$binary")"
  done
}

start=$(date +%s)

step "Debian packages for the test components"
current_step="install runtime packages"
install_packages "${DEB_PACKAGES[@]}"
for bin in docker-registry skopeo prometheus promtool faketime; do
  command -v $bin >/dev/null || die "$bin is not on PATH after installing ${DEB_PACKAGES[*]}"
done
command -v go >/dev/null || die "go is not on PATH (the servers below are built from the Go module proxy)"
info "$(go version)"

kube_dir=$CACHE_DIR/kube-$KUBE_VERSION-$RECIPE
etcd_dir=$CACHE_DIR/etcd-$ETCD_VERSION-$RECIPE
nats_dir=$CACHE_DIR/nats-server-$NATS_VERSION-$RECIPE

step "etcd $ETCD_VERSION"
build_etcd
step "nats-server $NATS_VERSION"
build_nats
step "kube-apiserver, kube-controller-manager and kubectl $KUBE_VERSION"
build_kubernetes "$KUBE_VERSION" "$kube_dir"
current_step="link platform"
link_platform "$CACHE_DIR/platform" "$kube_dir/kube-apiserver" "$kube_dir/kube-controller-manager" \
  "$kube_dir/kubectl" "$etcd_dir/etcd" "$nats_dir/nats-server"

if [ $with_floor -eq 1 ]; then
  floor_dir=$CACHE_DIR/kube-$KUBE_FLOOR_VERSION-$RECIPE
  step "floor version: kube-apiserver and kube-controller-manager $KUBE_FLOOR_VERSION"
  build_kubernetes "$KUBE_FLOOR_VERSION" "$floor_dir" servers
  current_step="link floor platform"
  link_platform "$CACHE_DIR/platform-floor" "$floor_dir/kube-apiserver" "$floor_dir/kube-controller-manager" \
    "$kube_dir/kubectl" "$etcd_dir/etcd" "$nats_dir/nats-server"
fi
# What only a later build would reuse costs gigabytes of disk.
rm -rf "$GOCACHE"

current_step="verify binaries"
for dir in "$CACHE_DIR/platform" "$CACHE_DIR/platform-floor"; do
  [ -d "$dir" ] || continue
  "$dir/kube-apiserver" --version >/dev/null 2>&1 || die "$dir/kube-apiserver does not run"
  info "$(basename "$dir"): $("$dir/kube-apiserver" --version), etcd $("$dir/etcd" --version | awk '/^etcd Version/ {print $3}'), nats-server $("$dir/nats-server" --version | awk '{print $2}')"
done
step "done in $(( $(date +%s) - start ))s (binaries: $CACHE_DIR/platform)"

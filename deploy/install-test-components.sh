#!/usr/bin/env bash
# Installs the real components pko's tests, loadtest and dev environment run against:
#   etcd-server, nats-server, docker-registry, skopeo      (Debian packages)
#   prometheus, promtool                                   (Debian package prometheus)
#   kubectl                                                (kubernetes-client, unless one is installed)
#   kube-apiserver, kube-controller-manager v1.20.2        (built from Debian's `kubernetes` source package)
#
# Idempotent. Built binaries are cached under ${XDG_CACHE_HOME:-$HOME/.cache}/pko/, so a second run only
# verifies what is there. Prints each step; stops with a message naming the failed step.
#
# Environment:
#   PKO_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/pko)
#   PKO_KUBE_BUILD_KEEP=1  keep the kubernetes build tree (for debugging the build)
set -euo pipefail

KUBE_VERSION=v1.20.2
# Bumped whenever the build recipe (patches below) changes, so a cached build from an older recipe is rebuilt.
KUBE_RECIPE=pko3
CACHE_DIR=${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}
KUBE_BIN_DIR=$CACHE_DIR/kube-$KUBE_VERSION-$KUBE_RECIPE
DEB_PACKAGES=(etcd-server nats-server docker-registry skopeo prometheus faketime)
BUILD_PACKAGES=(golang-go rsync jq make dpkg-dev golang-github-modern-go-reflect2-dev)

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf '\nerror: %s\n' "$*" >&2; exit 1; }
current_step=""
trap 'rc=$?; [ $rc -eq 0 ] || printf "\nerror: step failed (exit %s): %s\n" "$rc" "$current_step" >&2' EXIT

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

apt_updated=0
apt_update_once() {
  if [ $apt_updated -eq 0 ]; then
    current_step="apt-get update"
    info "apt-get update"
    $SUDO apt-get update -qq || die "apt-get update failed (is a Debian mirror reachable?)"
    apt_updated=1
  fi
}

install_packages() {
  if have_all_packages "$@"; then
    info "already installed: $*"
    return
  fi
  apt_update_once
  current_step="apt-get install $*"
  info "apt-get install $*"
  # Debian's postinst scripts try to start etcd/nats/registry as services; pko never uses those
  # instances (it starts its own on free ports), so service starts are suppressed for the install.
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee $policy >/dev/null && $SUDO chmod +x $policy && created_policy=1
  fi
  local rc=0
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  [ $created_policy -eq 1 ] && $SUDO rm -f $policy
  [ $rc -eq 0 ] || die "apt-get install failed for: $*"
}

start=$(date +%s)

step "Debian packages for the test components"
current_step="install runtime packages"
install_packages "${DEB_PACKAGES[@]}"
for bin in etcd nats-server docker-registry skopeo prometheus promtool faketime; do
  command -v $bin >/dev/null || die "$bin is not on PATH after installing ${DEB_PACKAGES[*]}"
done
if ! command -v kubectl >/dev/null; then
  current_step="install kubectl"
  install_packages kubernetes-client
fi
info "etcd $(etcd --version 2>/dev/null | head -n1 | awk '{print $3}'), nats-server $(nats-server --version 2>/dev/null | awk '{print $2}')"

step "kube-apiserver and kube-controller-manager $KUBE_VERSION"
if [ -x "$KUBE_BIN_DIR/kube-apiserver" ] && [ -x "$KUBE_BIN_DIR/kube-controller-manager" ] \
   && [ -f "$KUBE_BIN_DIR/.complete" ]; then
  info "cached in $KUBE_BIN_DIR"
else
  current_step="install build dependencies"
  install_packages "${BUILD_PACKAGES[@]}"

  # apt-get source needs a deb-src entry mirroring the configured bookworm deb entry.
  current_step="configure deb-src"
  src_list=/etc/apt/sources.list.d/pko-deb-src.sources
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    info "adding deb-src entry $src_list"
    uris=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uris" ] || uris=http://deb.debian.org/debian
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uris" \
      | $SUDO tee $src_list >/dev/null
    apt_updated=0
  fi
  apt_update_once

  work=$(mktemp -d "${TMPDIR:-/tmp}/pko-kube-build.XXXXXX")
  chmod 755 "$work" # apt-get source downloads as the _apt user
  [ "${PKO_KUBE_BUILD_KEEP:-0}" = 1 ] || trap 'rc=$?; rm -rf "$work"; [ $rc -eq 0 ] || printf "\nerror: step failed (exit %s): %s\n" "$rc" "$current_step" >&2' EXIT

  current_step="download Debian kubernetes source"
  info "apt-get source --download-only kubernetes (into $work)"
  (cd "$work" && apt-get source --download-only -qq kubernetes >/dev/null) || die "apt-get source kubernetes failed"
  tarball=$(ls "$work"/kubernetes_*.orig.tar.gz 2>/dev/null | head -n1)
  [ -n "$tarball" ] || die "no kubernetes orig tarball downloaded"
  info "$(basename "$tarball")"

  current_step="unpack kubernetes source"
  mkdir -p "$work/src"
  tar -xzf "$tarball" -C "$work/src" --strip-components=1 || die "cannot unpack $tarball"
  srcroot=$work/src
  [ -d "$srcroot/cmd/kube-apiserver" ] || die "unpacked source has no cmd/kube-apiserver"

  # reflect2 v1.0.1 (vendored) segfaults under Go >= 1.18 on the first custom-resource write; Debian ships v1.0.2.
  current_step="replace vendored reflect2"
  fixed=/usr/share/gocode/src/github.com/modern-go/reflect2
  [ -d "$fixed" ] || die "$fixed missing (package golang-github-modern-go-reflect2-dev)"
  rm -rf "$srcroot/vendor/github.com/modern-go/reflect2"
  cp -r "$fixed" "$srcroot/vendor/github.com/modern-go/reflect2"
  info "vendor/github.com/modern-go/reflect2 <- $(basename "$(dirname "$fixed")")/reflect2 (Debian)"

  # go-openapi/validate v0.19 (and kube-openapi's copy of it) compares two reflect.Values to detect "zero" data; from Go 1.16 on that
  # comparison is true for "", 0 and false, so the apiserver rejects every custom resource holding an
  # empty string, a zero or false ("Invalid value: null", kubernetes/kubernetes#99804). Only nil is null.
  current_step="patch vendored OpenAPI validators' zero-value check"
  zero_check='if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {'
  for typego in "$srcroot/vendor/github.com/go-openapi/validate/type.go" \
                "$srcroot/vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go"; do
    grep -qF "$zero_check" "$typego" || die "$typego: expected zero-value check not found"
    ZERO_CHECK=$zero_check perl -pi -e 's/\Q$ENV{ZERO_CHECK}\E/if data == nil {/' "$typego"
    grep -qF "$zero_check" "$typego" && die "$typego: patch did not apply"
    info "${typego#"$srcroot"/}: only nil counts as null"
  done

  current_step="build kube-apiserver and kube-controller-manager"
  mkdir -p "$srcroot/.go/src/k8s.io"
  ln -s "$srcroot" "$srcroot/.go/src/k8s.io/kubernetes"
  info "make WHAT=\"cmd/kube-apiserver cmd/kube-controller-manager\" (several minutes; log: $work/build.log)"
  b0=$(date +%s)
  if ! (cd "$srcroot/.go/src/k8s.io/kubernetes" && \
        env GOPATH="$srcroot/.go" GO111MODULE=off GOFLAGS= CGO_ENABLED=0 GOCACHE="$CACHE_DIR/go-build-cache" \
            KUBE_GIT_VERSION=$KUBE_VERSION KUBE_GIT_TREE_STATE=clean \
            make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$work/build.log" 2>&1); then
    tail -n 40 "$work/build.log" >&2
    die "kubernetes build failed (last lines above)"
  fi
  info "built in $(( $(date +%s) - b0 ))s"

  current_step="cache binaries"
  mkdir -p "$KUBE_BIN_DIR"
  for b in kube-apiserver kube-controller-manager; do
    out=$(find "$srcroot/_output" -type f -name "$b" -perm -u+x | head -n1)
    [ -n "$out" ] || die "build produced no $b"
    install -m 0755 "$out" "$KUBE_BIN_DIR/$b"
  done
  touch "$KUBE_BIN_DIR/.complete"
  rm -rf "$CACHE_DIR/go-build-cache"
fi
current_step="verify kube binaries"
"$KUBE_BIN_DIR/kube-apiserver" --version >/dev/null 2>&1 || die "$KUBE_BIN_DIR/kube-apiserver does not run"
info "$("$KUBE_BIN_DIR/kube-apiserver" --version) at $KUBE_BIN_DIR"

current_step="write environment file"
env_file=$CACHE_DIR/env
mkdir -p "$CACHE_DIR"
cat > "$env_file" <<ENV
# written by deploy/install-test-components.sh; the pko test harness reads PKO_KUBE_BIN_DIR
export PKO_KUBE_BIN_DIR=$KUBE_BIN_DIR
ENV
step "done in $(( $(date +%s) - start ))s (binaries: $KUBE_BIN_DIR)"

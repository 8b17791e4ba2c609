#!/usr/bin/env bash
# The installed-package contract: install a build into a temporary prefix,
# then configure, build and run out-of-tree consumers from a directory
# outside the source tree: a C program via find_package, the same via
# pkg-config, and a C++ program via find_package (C++ API and rt.hpp). Each
# trains one step with block checkpointing and decodes one token.
#   bash tests/install/run.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
here="$(cd "$(dirname "$0")" && pwd)"
work=$(mktemp -d /tmp/riftco_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/riftco_transformer/rt.h include/riftco_transformer/rt.hpp include/riftco_transformer/transformer.hpp \
         include/riftco_transformer/hf_llama.hpp \
         lib/libriftco_transformer.a lib/libriftco_transformer.so.2 bin/rt-train bin/rt-generate bin/rt-convert \
         lib/cmake/riftco_transformer/riftco_transformerConfig.cmake \
         lib/cmake/riftco_transformer/riftco_transformerConfigVersion.cmake lib/pkgconfig/riftco_transformer.pc; do
  [ -e "$prefix/$f" ] || { echo "[install] $f is missing from the prefix"; exit 1; }
done
cp -r "$here/c_consumer" "$here/cpp_consumer" "$work/"
export OMP_NUM_THREADS=2
passed=0
for consumer in c_consumer cpp_consumer; do
  cmake -S "$work/$consumer" -B "$work/$consumer/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$work/$consumer/build" >/dev/null
  (cd "$work" && "$work/$consumer/build/$consumer")
  passed=$((passed + 1))
done
# pkg-config, with a plain compiler call.
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --modversion riftco_transformer
cc -std=c11 -Wall -Wextra -pedantic -Werror "$work/c_consumer/main.c" -o "$work/c_pkgconfig" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs riftco_transformer) -Wl,-rpath,"$prefix/lib"
(cd "$work" && "$work/c_pkgconfig")
passed=$((passed + 1))
# The library is the installed one, not the build tree's.
linked=$(ldd "$work/c_pkgconfig")  # captured first: grep -q closing the pipe early would fail it under pipefail
case "$linked" in
  *"$prefix/lib/libriftco_transformer.so.2"*) ;;
  *) echo "[install] not linked to the prefix:"; echo "$linked"; exit 1 ;;
esac
echo "install consumers: $passed passed, 0 failed"

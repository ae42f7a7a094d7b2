#!/usr/bin/env bash
# Regenerates exporter/_proto/ from proto/. The generator is pinned: the
# committed output must equal what this script writes (tests/test_proto_gen.py).
#   proto/generate.sh [OUTPUT_DIR]   (default: exporter/_proto)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${1:-$root/exporter/_proto}
py=${PYTHON:-python}
want_tools=1.85.1
want_mypy_protobuf=5.1.0
have_tools=$("$py" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')
have_mp=$("$py" -c 'import importlib.metadata as m; print(m.version("mypy-protobuf"))')
if [ "$have_tools" != "$want_tools" ] || [ "$have_mp" != "$want_mypy_protobuf" ]; then
  echo "generate.sh: need grpcio-tools==$want_tools and mypy-protobuf==$want_mypy_protobuf (have $have_tools, $have_mp)" >&2
  exit 1
fi
plugin_dir=$(dirname "$("$py" -c 'import shutil,sys; print(shutil.which("protoc-gen-mypy", path=__import__("os").path.dirname(sys.executable)))')")
rm -rf "$out/podresources"
mkdir -p "$out"
for version in v1 v1alpha1; do
  PATH="$plugin_dir:$PATH" "$py" -m grpc_tools.protoc -I "$here" \
    --python_out="$out" --mypy_out="$out" \
    --grpc_python_out="$out" --mypy_grpc_out="$out" \
    "podresources/$version/api.proto"
  # protoc writes imports relative to proto/; make them package-absolute.
  sed -i "s/^from podresources\.$version import/from exporter._proto.podresources.$version import/" \
    "$out/podresources/$version/api_pb2_grpc.py" "$out/podresources/$version/api_pb2_grpc.pyi"
  touch "$out/podresources/$version/__init__.py"
done
touch "$out/__init__.py" "$out/podresources/__init__.py"

#!/usr/bin/env bash
# Regenerates exporter/_proto/ (the product's protos) and tests/_proto/ (protos of test
# peers: the device plugin, the DRA driver's dra, dra-health and plugin registration) from proto/. The generator is pinned: the committed
# output must equal what this script writes (tests/test_proto_gen.py).
#   proto/generate.sh [OUTPUT_DIR [TEST_OUTPUT_DIR]]
#   (defaults: exporter/_proto and tests/_proto)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${1:-$root/exporter/_proto}
tests_out=${2:-$root/tests/_proto}
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
# gen OUTPUT PACKAGE PROTO_DIR: one proto/PROTO_DIR/api.proto into OUTPUT/PROTO_DIR, its
# imports rewritten to PACKAGE (protoc writes them relative to proto/).
gen() {
  local dest=$1 package=$2 dir=$3
  PATH="$plugin_dir:$PATH" "$py" -m grpc_tools.protoc -I "$here" \
    --python_out="$dest" --mypy_out="$dest" \
    --grpc_python_out="$dest" --mypy_grpc_out="$dest" \
    "$dir/api.proto"
  local module=${dir//\//.}
  sed -i "s/^from $module import/from $package.$module import/" \
    "$dest/$dir/api_pb2_grpc.py" "$dest/$dir/api_pb2_grpc.pyi"
  touch "$dest/$dir/__init__.py" "$dest/${dir%%/*}/__init__.py"
}
rm -rf "$out/podresources" "$out/podsapi"
mkdir -p "$out"
for version in v1 v1alpha1; do
  gen "$out" exporter._proto "podresources/$version"
done
# The kubelet Pods API (KEP-4188) and the few v1.Pod fields read from its pod bytes.
for dir in podsapi/v1alpha1 podsapi/corev1; do
  gen "$out" exporter._proto "$dir"
done
touch "$out/__init__.py"
# Test peers' protos: never shipped (tests/ is not in the wheel).
rm -rf "$tests_out/deviceplugin" "$tests_out/dra" "$tests_out/drahealth" "$tests_out/pluginregistration"
mkdir -p "$tests_out"
for dir in deviceplugin/v1beta1 dra/v1 drahealth/v1alpha1 pluginregistration/v1; do
  gen "$tests_out" tests._proto "$dir"
done
touch "$tests_out/__init__.py"

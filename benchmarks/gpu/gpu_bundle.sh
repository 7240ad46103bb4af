#!/usr/bin/env bash
# vLLM 0.26.0 for the H200 in two device calls instead of six: run ../shared/gpu/prepare.sh first (its .vp/c1-c6),
# then this, from the repository root. It unpacks the wheel, leaves out what these benchmarks never load (the
# FlashAttention-2 kernels: the H200 runs FA3; the MoE kernels; the Rust front end; the sm100 FMHA sources),
# adds the small wheels prepare.sh fetched and py-spy, and writes .vp/s1 and .vp/s2 (<= 44 MiB each, ignored).
#
# On the GPU machine, call 1 carries .vp/s1:  mkdir -p /tmp/parts && cp .vp/s1/site.part-0 /tmp/parts/
# call 2, back to back, carries .vp/s2:       bash .vp/s2/install.sh && export PYTHONPATH=/tmp/site:$PWD \
#                                               PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 && ...
set -eu
[ -f .vp/c6/wheel.sha256 ] || { echo "run ../shared/gpu/prepare.sh first"; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat .vp/c1/vllm.whl.part-* .vp/c2/vllm.whl.part-* .vp/c3/vllm.whl.part-* .vp/c4/vllm.whl.part-* \
    .vp/c5/vllm.whl.part-* .vp/c6/vllm.whl.part-* > "$WORK/$(awk '{print $2}' .vp/c6/wheel.sha256)"
(cd "$WORK" && sha256sum -c "$OLDPWD/.vp/c6/wheel.sha256")
mkdir -p "$WORK/site/bin"
(cd "$WORK/site" && unzip -q ../vllm-*.whl \
    && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs \
    && rm -rf vllm/third_party/fmha_sm100 \
    && for w in "$OLDPWD"/.vp/c6/whl/*.whl "$OLDPWD"/.vp/c6/opt/*.whl; do unzip -q -o "$w"; done)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$WORK/spy" py-spy==0.4.3
(cd "$WORK/spy" && unzip -q py_spy-*.whl && mv py_spy-*.data/scripts/py-spy "$WORK/site/bin/")
tar -C "$WORK" -cf - site | xz -T0 -6 > "$WORK/site.tar.xz"
rm -rf .vp/s1 .vp/s2 && mkdir -p .vp/s1 .vp/s2
(cd "$WORK" && split -b 44m -d -a 1 site.tar.xz site.part- && sha256sum site.tar.xz | awk '{print $1}' > sha)
# Two calls carry two parts; a third would be left behind and only show as a checksum error on the GPU.
[ "$(ls "$WORK"/site.part-* | wc -l)" = 2 ] || { echo "the bundle needs more than two 44 MiB parts"; exit 3; }
mv "$WORK/site.part-0" .vp/s1/ && mv "$WORK/site.part-1" "$WORK/sha" .vp/s2/
cat > .vp/s2/install.sh <<'INSTALL'
#!/usr/bin/env bash
# On the GPU machine: join the two parts (the first came in the call before), check, unpack to /tmp/site.
set -eu
D=$(cd "$(dirname "$0")" && pwd)
[ -f /tmp/parts/site.part-0 ] || { echo "PART 0 MISSING: the machine went cold"; exit 10; }
cat /tmp/parts/site.part-0 "$D/site.part-1" > /tmp/site.tar.xz
echo "$(cat "$D/sha")  /tmp/site.tar.xz" | sha256sum -c - || { echo "SHA MISMATCH"; exit 11; }
tar -xJf /tmp/site.tar.xz -C /tmp && rm -f /tmp/site.tar.xz
PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 python3 -c "import vllm, torch; from vllm.v1.engine.async_llm import AsyncLLM; print('vllm', vllm.__version__, 'torch', torch.__version__, 'IMPORT OK')"
INSTALL
du -sh .vp/s1 .vp/s2

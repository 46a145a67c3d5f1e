# TIMEOUT=150
# Makes the gpt_oss goldens with transformers on the GPU machine (CPU torch) and prints them into the log, one
# base64 block per case (tar | xz | base64), to be decoded into tests/goldens/ (tests/goldens/README.md).
set -u
python3 -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__, "gpt_oss:", hasattr(transformers, "GptOssForCausalLM"), "Mxfp4Config:", hasattr(transformers, "Mxfp4Config"))'
out=$(mktemp -d)
python3 tests/goldens/make_gptoss_golden.py "$out"
echo "generator exit $?"
for d in "$out"/*/; do
    n=$(basename "$d")
    echo "=== BEGIN $n $(tar -C "$out" -cf - "$n" | sha256sum | cut -c1-16)"
    tar -C "$out" -cf - "$n" | xz -9 | base64 -w 100
    echo "=== END $n"
done

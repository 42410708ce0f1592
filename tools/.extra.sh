B=build-gpu; M=/tmp/q35-2b; export LD_LIBRARY_PATH=/tmp/dq-deps/usr/lib/x86_64-linux-gnu
cmake --build $B -j16 > /dev/null 2>&1 || echo BUILD FAILED
$B/tests/cuda/test_cuda 2>&1 | grep -E "PASSED|FAILED" | head -3
[ -d $M ] || $B/deltaq make-model --like qwen3.5-2b --seed 1 -o $M >/dev/null 2>&1
$B/deltaq run -m $M --ids 5,6,7,8 -n 40 --hash-logits --device cuda 2>&1 | grep hash
for v in 0 1; do echo "-- variant $v"
DELTAQ_MV_RES_VARIANT=$v $B/deltaq bench -m $M --device cuda --tokens 500 --prompt 32 2>&1 | grep -E "^decode"
DELTAQ_MV_RES_VARIANT=$v $B/deltaq-bench-stages --device cuda --reps 20 2>&1 | grep -E "x\[|graph per" | grep -v 248320
done
DELTAQ_MV_RES_SKIP=1 $B/deltaq-bench-stages --device cuda --reps 20 2>&1 | grep -E "x\[" | grep -v 248320 | sed 's/^/skip1 /'

#!/usr/bin/env bash
# What bounds the tensor-core mixes kernel (HC_MIX_PART tc = 1) on a GPU: copies of the tree with
# shaders/hc_mix.comp edited, each timed at T = 4096, D = 4096 (results/h200/ablate_tc_h200.txt).
#   base         as committed
#   nomma        without the coopMatMulAddNV products (loads, staging, epilogue only)
#   cheapsplit   hi = v·σ unrounded (the split's arithmetic left out: wrong sums, timing only)
#   noxload      X not read (the value staged is the token index)
#   nomma_cheap  nomma and cheapsplit together
#     . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; bash tools/ablate_tc.sh
exp() {  # exp NAME SED
    rm -rf "/tmp/$1" && cp -r . "/tmp/$1" && (cd "/tmp/$1" && sed -i "$2" shaders/hc_mix.comp && \
      PYTHONPATH="/tmp/$1:$PYTHONPATH" python3 tools/hc_tune.py --ops HC_MIX --t 4096 --d 4096 --set mix.kernel=tc \
      --per-dispatch 2>&1 | tail -1 | sed "s/^/$1 /")
}
exp base 's/^//'
exp nomma '/c[12]\[n\] = coopMatMulAddNV/d'
exp cheapsplit 's/^    hi = mix(normal, sub, .*$/    hi = a;/'
exp noxload 's/vec4 v = live ? x\[p.x_off + t \* p.x_st + s \* p.x_ss + c\] : vec4(0.0);/vec4 v = vec4(float(t));/'
exp nomma_cheap '/c[12]\[n\] = coopMatMulAddNV/d; s/^    hi = mix(normal, sub, .*$/    hi = a;/'

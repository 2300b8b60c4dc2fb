"""Shard sizes against values computed here, independently of shared_plans/plan.py."""
import pytest
import yaml

from conftest import PRESETS
from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.shared_plans import plan
from dlio_ckpt_ext.errors import ConfigError

LLAMA3_8B = dict(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, vocab_size=128256,
                 num_attention_heads=32, num_kv_heads=8)


def independent_total(L, h, f, V, heads, kv, tp, pp, zero, ranks, data=None, mdt=2, odt=4):
    """Whole-checkpoint bytes from DESIGN.md section 4, written out in closed form."""
    dkv = (h // heads) * kv
    mp = tp * pp
    dp = data or ranks // mp
    s = dp if zero == 3 else 1
    n_params = 2 * V * h + h + L * (2 * h + h * (h + 2 * dkv) + h * h + 3 * f * h)

    def layer(sh):
        return (h // sh + h * (h + 2 * dkv) // tp // sh + h * h // tp // sh + h // sh
                + 2 * h * f // tp // sh + h * f // tp // sh)
    if zero == 3:
        model = ranks * (L * layer(s) + 2 * (h * V // tp // s) + h // s) * mdt
    else:  # one replica (tp shards, layers spread over pp stages) writes the model
        model = tp * (L * layer(1) + 2 * (h * V // tp) + h) * mdt
    writers = ranks if zero > 0 else mp
    n = n_params // (dp * mp) if zero > 0 else n_params // mp
    return model + writers * (3 * n + 15 * h) * odt


def preset(name):
    with open(PRESETS / f"{name}.yaml") as fh:
        m = yaml.safe_load(fh)["workload"]["model"]
    t, p = m["transformer"], m["parallelism"]
    shape = plan.ModelShape(m["num_layers"], t["hidden_size"], t["ffn_hidden_size"], t["vocab_size"],
                            t["num_attention_heads"], t["num_kv_heads"])
    return shape, plan.Parallelism(p["tensor"], p["pipeline"], p["zero_stage"])


def test_llama3_8b_zero3_four_ranks_per_rank_sizes():
    shape = plan.ModelShape(**LLAMA3_8B)
    for rank in range(4):
        rp = layouts.rank_plan(shape, plan.Parallelism(zero_stage=3), 4, rank)
        assert [(f.name, f.size) for f in rp.files] == [
            (f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", 4_015_130_624),
            (f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", 24_091_029_504)]
    total = layouts.checkpoint_bytes(shape, plan.Parallelism(zero_stage=3), 4)
    assert total == 4 * (4_015_130_624 + 24_091_029_504)
    assert round(total / 2**30, 2) == 104.70


def test_llama3_8b_24_layers():
    shape = plan.ModelShape(**{**LLAMA3_8B, "num_layers": 24})
    sizes = [f.size for f in layouts.rank_plan(shape, plan.Parallelism(zero_stage=3), 4, 0).files]
    assert sizes == [3_142_682_624, 18_856_341_504]


@pytest.mark.parametrize("name, ranks, expected", [
    ("llama3_8b_checkpoint", 8, None),
    ("llama3_70b_checkpoint", 64, 978_406_572_032),
    ("llama3_405b_checkpoint", 512, 5_682_508_791_808),
    ("llama3_1t_checkpoint", 1024, 16_564_174_094_592),
])
def test_preset_totals(name, ranks, expected):
    shape, par = preset(name)
    got = layouts.checkpoint_bytes(shape, par, ranks)
    assert got == independent_total(shape.num_layers, shape.hidden_size, shape.ffn_hidden_size,
                                     shape.vocab_size, shape.num_attention_heads, shape.num_kv_heads,
                                     par.tensor, par.pipeline, par.zero_stage, ranks)
    if expected is not None:
        assert got == expected


def test_zero1_pipeline_writes_layer_files_on_first_replica_only():
    shape, par = preset("llama3_405b_checkpoint")
    first = layouts.rank_plan(shape, par, 512, 0)      # dp 0, pp stage 0: embedding + 4 layers
    assert [f.name for f in first.files][:2] == ["layer_00-model_00-model_states.pt",
                                                  "layer_01-model_00-model_states.pt"]
    assert first.files[0].size == 16384 * 128256 // 8 * 2
    second_replica = layouts.rank_plan(shape, par, 512, 256)  # dp rank 1
    assert [f.kind for f in second_replica.files] == ["optimizer"]
    last_stage = layouts.rank_plan(shape, par, 512, 255)  # pp stage 31 ends with lm_head and norm
    names = [f.name for f in last_stage.files]
    assert "layer_127-model_255-model_states.pt" in names and "layer_128-model_255-model_states.pt" in names


def test_zero0_only_first_model_parallel_group_writes():
    shape = plan.ModelShape(**LLAMA3_8B)
    par = plan.Parallelism(tensor=2, zero_stage=0)
    assert layouts.rank_plan(shape, par, 4, 2).files == ()
    assert len(layouts.rank_plan(shape, par, 4, 1).files) == 2
    assert layouts.checkpoint_bytes(shape, par, 4) == independent_total(32, 4096, 14336, 128256, 32, 8,
                                                                     2, 1, 0, 4)


def test_subset_mode_uses_configured_data_parallelism():
    shape = plan.ModelShape(**LLAMA3_8B)
    par = plan.Parallelism(zero_stage=3, data=8, mode="subset")
    full = layouts.rank_plan(shape, plan.Parallelism(zero_stage=3), 8, 0)
    subset = layouts.rank_plan(shape, par, 2, 0)  # 2 of the 8 ranks
    assert [f.size for f in subset.files] == [f.size for f in full.files]


@pytest.mark.parametrize("par, ranks, key", [
    (plan.Parallelism(tensor=3), 6, "model.parallelism.tensor"),
    (plan.Parallelism(tensor=16), 16, "model.parallelism.tensor"),  # 32 query heads but 8 KV heads
    (plan.Parallelism(pipeline=2, zero_stage=3), 2, "model.parallelism.pipeline"),
    (plan.Parallelism(zero_stage=4), 1, "model.parallelism.zero_stage"),
    (plan.Parallelism(mode="subset"), 2, "model.parallelism.data"),
    (plan.Parallelism(data=2, mode="subset"), 4, "MPI world size"),
    (plan.Parallelism(mode="partial"), 1, "checkpoint.mode"),
])
def test_invalid_parallelism_names_the_key(par, ranks, key):
    with pytest.raises(ConfigError) as err:
        layouts.rank_plan(plan.ModelShape(**LLAMA3_8B), par, ranks, 0)
    assert err.value.key == key


def test_a_tensor_split_of_uneven_heads_is_refused_with_both_head_counts():
    """The tiny preset's 8 query and 2 KV heads at tensor=3: no framework splits heads so."""
    shape = plan.ModelShape(4, 512, 1792, 8192, 8, 2)
    with pytest.raises(ConfigError) as err:
        layouts.rank_plan(shape, plan.Parallelism(tensor=3), 3, 0)
    assert str(err.value) == ("invalid config: model.parallelism.tensor=3; allowed: a divisor of both "
                              "num_attention_heads 8 and num_kv_heads 2 (tensor parallelism splits the heads)")


@pytest.mark.parametrize("name, ranks", [("llama3_8b_checkpoint", 8), ("llama3_70b_checkpoint", 64),
                                         ("llama3_405b_checkpoint", 512), ("llama3_1t_checkpoint", 1024),
                                         ("llama3_tiny_checkpoint", 1)])
def test_every_preset_passes_the_checks_at_its_ranks(name, ranks):
    shape, par = preset(name)
    plan.validate(shape, par, ranks)

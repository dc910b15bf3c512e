"""Tensor parallelism with Tessera's ops (DTensor sharding rules, 2 gloo processes) and
the op tracer."""

import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import tessera

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "examples"))

ops = torch.ops.tessera


def _spawn(worker, tmp_path):
    port = 29600 + os.getpid() % 1000
    mp.spawn(worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]


def _init(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _finish():
    """Ends a worker once every rank is done: tearing down gloo's threads (and DDP's
    reducer) at exit can deadlock on the GIL in PyTorch, so leave without destructors."""
    dist.barrier()
    os._exit(0)


def _block_worker(rank, world, port, result_dir):
    import tensor_parallel

    _init(rank, world, port)
    out_diff, grad_diff, trace = tensor_parallel.check()
    split, whole = tensor_parallel.check_training()
    torch.save(
        {
            "out": out_diff,
            "grad": grad_diff,
            "launches": trace.launches,
            "tessera": dict(trace.tessera),
            "split": split,
            "whole": whole,
        },
        pathlib.Path(result_dir) / f"rank{rank}.pt",
    )
    _finish()


def test_tensor_parallel_llama_block_and_gpt_training_match_the_whole_model(tmp_path):
    for r in _spawn(_block_worker, tmp_path):
        assert r["out"] < 1e-5 and r["grad"] < 1e-4, r
        for step, (a, b) in enumerate(zip(r["split"], r["whole"])):
            assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (step, r["split"], r["whole"])
        # The kernels ran on each rank's shard: 2 of 4 query heads, 1 of 2 kv heads, half
        # of the MLP's 128 hidden columns; forward and backward.
        launched = " | ".join(r["launches"])
        assert "flash_attention batch=2,heads=2,kv_heads=1," in launched, launched
        assert "flash_attention_bwd batch=2,heads=2,kv_heads=1," in launched, launched
        assert "swiglu rows=48,cols=64," in launched, launched
        assert r["tessera"]["tessera.flash_attention_fwd.default"] == 1, r["tessera"]


def _rules_worker(rank, world, port, result_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    _init(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 10), torch.rand(10) + 0.5, torch.randn(10)
    y = torch.randn(10, 8)
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    pad = (torch.arange(12) < torch.tensor([[12], [5]]))[:, None, None, :].expand(2, 1, 12, 12).contiguous()
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    qv, kv, vv = torch.randn(4, 12, 8), torch.randn(2, 12, 8), torch.randn(2, 12, 8)
    pq, pk, pv = torch.randn(3, 4, 8), torch.randn(2, 6, 4, 8), torch.randn(2, 6, 4, 8)
    table = torch.tensor([[0, 1, 2], [3, 4, 5], [5, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([12, 1, 7], dtype=torch.int32)

    def dt(t, *placement):
        return distribute_tensor(t, mesh, list(placement))

    R = Replicate()
    cases = {
        "softmax rows": (lambda a: ops.softmax(a), [dt(x, Shard(0))], [x]),
        "rms_norm rows": (lambda a, c: ops.rms_norm(a, c, 1e-5), [dt(x, Shard(0)), dt(w, R)], [x, w]),
        "layer_norm rows": (
            lambda a, c, d: ops.layer_norm(a, c, d, 1e-5),
            [dt(x, Shard(0)), dt(w, R), dt(b, R)],
            [x, w, b],
        ),
        "swiglu cols": (lambda a, c: ops.swiglu(a, c), [dt(x, Shard(1)), dt(x * 2, Shard(1))], [x, x * 2]),
        "matmul rows": (lambda a, c: ops.matmul(a, c), [dt(x, Shard(0)), dt(y, R)], [x, y]),
        "matmul cols": (lambda a, c: ops.matmul(a, c), [dt(x, R), dt(y, Shard(1))], [x, y]),
        "matmul contraction": (lambda a, c: ops.matmul(a, c), [dt(x, Shard(1)), dt(y, Shard(0))], [x, y]),
        "flash_attention heads": (
            lambda a, c, d: ops.flash_attention(a, c, d, True),
            [dt(q, Shard(1)), dt(k, Shard(1)), dt(v, Shard(1))],
            [q, k, v],
        ),
        "flash_attention batch": (
            lambda a, c, d: ops.flash_attention(a, c, d, True),
            [dt(q, Shard(0)), dt(k, Shard(0)), dt(v, Shard(0))],
            [q, k, v],
        ),
        "flash_attention masked heads": (
            lambda a, c, d, m: ops.flash_attention(a, c, d, mask=m),
            [dt(q, Shard(1)), dt(k, Shard(1)), dt(v, Shard(1)), dt(pad, R)],
            [q, k, v, pad],
        ),
        "flash_attention masked batch": (
            lambda a, c, d, m: ops.flash_attention(a, c, d, mask=m),
            [dt(q, Shard(0)), dt(k, Shard(0)), dt(v, Shard(0)), dt(pad, Shard(0))],
            [q, k, v, pad],
        ),
        "varlen_attention heads": (
            lambda a, c, d, e: ops.varlen_attention(a, c, d, e, e, True),
            [dt(qv, Shard(0)), dt(kv, Shard(0)), dt(vv, Shard(0)), dt(cu, R)],
            [qv, kv, vv, cu],
        ),
        "paged_attention heads": (
            lambda a, c, d, e, f: ops.paged_attention(a, c, d, e, f),
            [dt(pq, Shard(1)), dt(pk, Shard(0)), dt(pv, Shard(0)), dt(table, R), dt(lens, R)],
            [pq, pk, pv, table, lens],
        ),
    }
    results = {}
    for name, (fn, sharded, plain) in cases.items():
        with tessera.trace_ops() as trace:
            got = fn(*sharded)
        results[name] = {
            "diff": (got.full_tensor() - fn(*plain)).abs().max().item(),
            "placements": [str(p) for p in got.placements],
            "launches": trace.launches,
        }
    torch.save(results, pathlib.Path(result_dir) / f"rank{rank}.pt")
    _finish()


def test_sharding_rules_run_each_op_on_local_shards(tmp_path):
    results = _spawn(_rules_worker, tmp_path)
    placements = {
        "softmax rows": "S(0)",
        "rms_norm rows": "S(0)",
        "layer_norm rows": "S(0)",
        "swiglu cols": "S(1)",
        "matmul rows": "S(0)",
        "matmul cols": "S(1)",
        "matmul contraction": "P(sum)",
        "flash_attention heads": "S(1)",
        "flash_attention batch": "S(0)",
        "flash_attention masked heads": "S(1)",
        "flash_attention masked batch": "S(0)",
        "varlen_attention heads": "S(0)",
        "paged_attention heads": "S(1)",
    }
    for name, want in placements.items():
        for r in results:
            assert r[name]["diff"] < 1e-5, (name, r[name])
            assert r[name]["placements"] == [want], (name, r[name])
            assert len(r[name]["launches"]) == 1, (name, r[name])  # the shard, not a gather
    local = results[0]
    assert "heads=2,kv_heads=1," in local["flash_attention heads"]["launches"][0]
    assert "batch=1," in local["flash_attention batch"]["launches"][0]
    assert "mask=shared" in local["flash_attention masked batch"]["launches"][0]  # this rank's entry
    assert "rows=3," in local["softmax rows"]["launches"][0]
    assert "heads=2,kv_heads=1," in local["varlen_attention heads"]["launches"][0]
    assert "heads=2,kv_heads=1," in local["paged_attention heads"]["launches"][0]


def test_trace_ops_counts_ops_launches_and_fallbacks():
    q = torch.randn(1, 4, 16, 8)
    with tessera.trace_ops() as trace:
        ops.softmax(torch.randn(3, 5))
        tessera.enable_sdpa_override()
        try:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        finally:
            tessera.disable_sdpa_override()
    assert trace.tessera["tessera.softmax.default"] == 1
    assert trace.tessera["tessera.flash_attention.default"] == 1
    # The declined call ran PyTorch's own kernels.
    assert trace.aten["aten.bernoulli_.float"] == 1 and trace.aten["aten.bmm.default"] == 2, trace.aten
    assert [launch.split()[0] for launch in trace.launches] == ["softmax", "flash_attention"]
    assert trace.launches[0].startswith("softmax rows=3,cols=5,")
    assert trace.fallbacks == [("scaled_dot_product_attention", "dropout is not supported")]
    assert "fallbacks: 1" in str(trace)
    # Nothing is recorded outside a trace.
    ops.softmax(torch.randn(2, 2))
    with tessera.trace_ops() as empty:
        pass
    assert empty.launches == [] and not empty.tessera


def _data_parallel_worker(rank, world, port, result_dir):
    import data_parallel

    _init(rank, world, port)
    result = {mode: run(rank, world) for mode, run in data_parallel.MODES.items()}
    result["graph_stats"] = tessera.graph_stats()
    torch.save(result, pathlib.Path(result_dir) / f"rank{rank}.pt")
    _finish()


def test_fsdp2_and_graph_mode_under_ddp_train_like_one_process(tmp_path):
    import data_parallel

    ranks = _spawn(_data_parallel_worker, tmp_path)
    # FSDP2 of the Tessera-op GPT against the same model in one process on whole batches;
    # graph mode under DDP against plain PyTorch in one process.
    want = {
        "fsdp": data_parallel.train(data_parallel.model(use_tessera=True)),
        "ddp-graph": data_parallel.train(data_parallel.model(use_tessera=False)),
    }
    for r in ranks:
        for mode, losses in want.items():
            assert len(r[mode]) == len(losses)
            for step, (got, ref) in enumerate(zip(r[mode], losses)):
                assert abs(got - ref) <= 2e-3 * max(1.0, abs(ref)), (mode, step, r[mode], losses)
        kernels = r["graph_stats"]["kernels"]
        assert {"flash_attention", "flash_attention_bwd", "rms_norm", "swiglu"} <= set(kernels), kernels
        assert r["graph_stats"]["fallbacks"] == {}, r["graph_stats"]

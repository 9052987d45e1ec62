"""Ghost BN (Goyal §2.3): BN statistics over groups of exactly bn_batch samples, in any layout."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lbsgd.models import ghost_bn
from lbsgd.models.ghost_bn import GhostBatchNorm, RunningStats


def make(c=3, n=4, seed=0):
    torch.manual_seed(seed)
    bn = GhostBatchNorm(c, group_size=n)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


@pytest.mark.parametrize("groups", [1, 3])
def test_each_group_of_bn_batch_samples_is_normalised_on_its_own(groups):
    n, c = 4, 3
    bn = make(c, n)
    x = torch.randn(groups * n, c, 5, 5, requires_grad=True)
    y = bn(x)
    # reference: plain training-mode BN applied to each group separately
    x_ref = x.detach().clone().requires_grad_(True)
    w, b = (
        bn.weight.detach().clone().requires_grad_(True),
        bn.bias.detach().clone().requires_grad_(True),
    )
    ref = torch.cat(
        [F.batch_norm(part, None, None, w, b, True, 0.0, bn.eps) for part in x_ref.split(n)]
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    upstream = torch.randn_like(y)
    (y * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.weight.grad, w.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.bias.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_channels_last_input_gives_the_same_result():
    bn = make(3, 4)
    x = torch.randn(8, 3, 5, 5)
    torch.testing.assert_close(bn(x.contiguous(memory_format=torch.channels_last)), bn(x))


def test_running_statistics_follow_the_stated_rule_by_hand():
    # one channel, n = 2, two groups: [1, 3] and [5, 7]
    # group means 2 and 6 -> average 4; unbiased variances 2 and 2 -> average 2
    # G = 2 groups, momentum 0.1: keep = 0.9^2 = 0.81
    # running_mean = 0.81 * 0 + 0.19 * 4 = 0.76; running_var = 0.81 * 1 + 0.19 * 2 = 1.19
    bn = GhostBatchNorm(1, group_size=2)
    bn(torch.tensor([1.0, 3.0, 5.0, 7.0]).view(4, 1))
    assert bn.running_mean.item() == 0.0  # nothing moves before the step is committed
    RunningStats([bn], groups=2).commit()
    assert bn.running_mean.item() == pytest.approx(0.76)
    assert bn.running_var.item() == pytest.approx(1.19)
    assert bn.num_batches_tracked.item() == 1
    assert bn.group_mean_sum.item() == 0.0  # the step's sums are cleared for the next step


def test_running_statistics_do_not_depend_on_how_groups_are_laid_out():
    n, c, groups = 4, 3, 8
    x = torch.randn(groups * n, c, 2, 2)
    one = make(c, n)  # one forward of all 8 groups
    one(x)
    RunningStats([one], groups).commit()
    accum = make(c, n)  # 4 micro-batches of 2 groups, accumulated
    for part in x.split(2 * n):
        accum(part)
    RunningStats([accum], groups).commit()
    ranks = [make(c, n), make(c, n)]  # 2 "processes" x 2 micro-batches, sums all-reduced
    for r, bn in enumerate(ranks):
        for part in x[r * 4 * n : (r + 1) * 4 * n].split(2 * n):
            bn(part)
    flats = [torch.cat([bn.group_mean_sum, bn.group_var_sum]) for bn in ranks]
    for bn in ranks:
        RunningStats([bn], groups, all_reduce_sum=lambda t: flats[0] + flats[1]).commit()
    for bn in (accum, *ranks):
        torch.testing.assert_close(bn.running_mean, one.running_mean, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(bn.running_var, one.running_var, rtol=1e-6, atol=1e-7)


def test_convert_keeps_parameters_buffers_and_state_dict_keys():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    model[1].running_mean.fill_(0.3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ghost_bn.convert(model, group_size=2)
    assert [type(m) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] == [
        GhostBatchNorm,
        GhostBatchNorm,
    ]
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k in before:
        assert torch.equal(after[k], before[k]), k
    model.eval()  # evaluation uses the running statistics, as plain BN does
    x = torch.randn(3, 3, 6, 6)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    ref.load_state_dict(before)
    torch.testing.assert_close(model(x), ref.eval()(x))


def test_micro_batch_that_is_not_a_multiple_of_bn_batch_is_refused():
    with pytest.raises(RuntimeError, match="micro-batch of 6 is not a multiple of bn_batch=4"):
        make(3, 4)(torch.randn(6, 3, 2, 2))


def test_channels_last_stays_channels_last_through_forward_and_backward():
    # the next convolution's fast path needs its input channels_last; so does the previous one's
    # gradient (Goyal's n = 32 inside a micro-batch of 4 groups)
    bn = make(6, 4)
    x = torch.randn(16, 6, 5, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = bn(x)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    y.backward(torch.randn_like(y))
    assert x.grad.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("groups", [2, 3, 8])
def test_the_one_pass_equals_a_kernel_per_group_forward_and_backward(fmt, groups):
    """Output, statistics (each group's mean and unbiased variance) and the input, weight and bias
    gradients of the one pass equal the per-group loop's (one native kernel a group), the output
    and input gradient in the input's memory format."""
    from lbsgd.bench.ghost import PerGroupLoop

    n, c = 4, 5
    x = (3 + 2 * torch.randn(groups * n, c, 3, 3)).contiguous(memory_format=fmt)
    upstream = torch.randn(groups * n, c, 3, 3)
    results = []
    for fn in (ghost_bn.OnePassBatchNorm.apply, PerGroupLoop.apply):
        bn = make(c, n)
        xi = x.clone().requires_grad_()
        stats = torch.zeros(2, groups, c)
        y = fn(xi, bn.weight, bn.bias, stats, n, bn.eps)
        y.backward(upstream)
        assert y.is_contiguous(memory_format=fmt) and xi.grad.is_contiguous(memory_format=fmt)
        results.append((y.detach(), stats, xi.grad, bn.weight.grad, bn.bias.grad))
    for one, loop in zip(*results, strict=True):
        torch.testing.assert_close(one, loop, rtol=1e-5, atol=1e-5)
    ref = x.reshape(groups, n, c, 9).transpose(1, 2).reshape(groups, c, n * 9)
    torch.testing.assert_close(results[0][1][0], ref.mean(-1))
    torch.testing.assert_close(results[0][1][1], ref.var(-1, unbiased=True))


def test_an_in_place_relu_may_follow_and_its_gradient_is_the_loops():
    """The output is no view (autograd forbids an in-place op on a custom Function's view), so a
    network's ReLU(inplace=True) after it trains, with the per-group loop's gradients."""
    from lbsgd.bench.ghost import PerGroupLoop

    x = torch.randn(12, 5, 3, 3)
    grads = []
    for fn in (ghost_bn.OnePassBatchNorm.apply, PerGroupLoop.apply):
        bn = make(5, 4)
        xi = x.clone().requires_grad_()
        F.relu(
            fn(xi, bn.weight, bn.bias, torch.zeros(2, 3, 5), 4, bn.eps), inplace=True
        ).sum().backward()
        grads.append(xi.grad)
    torch.testing.assert_close(*grads, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_fp32_one_pass_makes_no_buffer_the_size_of_the_activations_but_its_output(fmt):
    """What its CPU speed rests on: forward, the only allocation as large as the input is the
    output (the squares about the mean are written into it first); backward, the input gradient
    (the products with the incoming gradient likewise). Counted by the profiler's allocator."""
    from torch.profiler import profile

    bn = make(16, 8)
    x = torch.randn(64, 16, 8, 8).contiguous(memory_format=fmt).requires_grad_()
    upstream = torch.randn_like(x)

    def large(prof):
        return [e.name for e in prof.events() if e.self_cpu_memory_usage >= x.nbytes]

    with profile(profile_memory=True) as forward:
        y = ghost_bn.OnePassBatchNorm.apply(x, bn.weight, bn.bias, torch.zeros(2, 8, 16), 8, 1e-5)
    with profile(profile_memory=True) as backward:
        y.backward(upstream)
    assert large(forward) == ["aten::empty_strided"]  # torch.empty_like(x): the output
    assert large(backward) == ["aten::empty_strided"]  # the input gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_one_pass_reads_the_activations_in_four_kernels_forward_and_five_backward(dtype):
    """Its cost in any precision: the kernels that touch a tensor the size of the activations
    (views and allocations aside) are the mean, the squares about it, their mean and the
    normalisation forward; Σ dy, the products (x − μ)·dy, their sum and the gradient's two fused
    passes backward. Recorded at the dispatcher, so an added pass or copy shows."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Kernels(TorchDispatchMode):
        def __init__(self, numel):
            super().__init__()
            self.numel, self.names = numel, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if torch.is_tensor(t)]
            allocation = func.overloadpacket in (
                torch.ops.aten.empty_like,
                torch.ops.aten.empty_strided,
            )
            if not (func.is_view or allocation) and any(t.numel() == self.numel for t in tensors):
                self.names.append(func.overloadpacket.__name__)
            return out

    bn = make(16, 8)
    x = torch.randn(64, 16, 8, 8).to(dtype).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    with Kernels(x.numel()) as forward:
        y = ghost_bn.OnePassBatchNorm.apply(x, bn.weight, bn.bias, torch.zeros(2, 8, 16), 8, 1e-5)
    upstream = torch.randn_like(y)
    with Kernels(x.numel()) as backward:
        y.backward(upstream)
    assert forward.names == ["mean", "mse_loss", "mean", "addcmul"]
    assert backward.names == ["sum", "mse_loss_backward", "sum", "addcmul", "addcmul_"]


@pytest.mark.parametrize("shape", [(12, 5), (12, 5, 7), (12, 5, 2, 3, 3)])
def test_the_one_pass_takes_1d_and_3d_inputs_as_batchnorm1d_and_3d_do(shape):
    from lbsgd.bench.ghost import PerGroupLoop

    x, up = torch.randn(shape), torch.randn(shape)
    out = []
    for fn in (ghost_bn.OnePassBatchNorm.apply, PerGroupLoop.apply):
        bn = make(5, 4)
        xi = x.clone().requires_grad_()
        fn(xi, bn.weight, bn.bias, torch.zeros(2, 3, 5), 4, bn.eps).backward(up)
        out.append((xi.grad, bn.weight.grad))
    for one, loop in zip(*out, strict=True):
        torch.testing.assert_close(one, loop, rtol=1e-5, atol=1e-5)


def test_one_group_is_one_native_batch_norm_bitwise():
    """A micro-batch of one BN group takes F.batch_norm itself: the runs made with one group
    replay bitwise."""
    bn = make(3, 8)
    x = torch.randn(8, 3, 5, 5, requires_grad=True)
    y = bn(x)
    w = bn.weight.detach().clone().requires_grad_()
    ref = F.batch_norm(x.detach(), None, None, w, bn.bias.detach(), True, 0.0, bn.eps)
    assert torch.equal(y, ref)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_the_one_pass_compiles_to_what_it_computes_eager(fmt):
    """Under torch.compile the same function runs, its temporaries left to the compiler (no
    output buffer to write the squares into): its output (in the input's memory format, no view:
    an in-place ReLU compiles after it), input and weight gradients and statistics equal the
    eager ones."""
    n, g, c = 4, 3, 6
    x = torch.randn(g * n, c, 4, 4).contiguous(memory_format=fmt)
    out = []
    for compiled in (False, True):
        bn = make(c, n)
        xi = x.clone().requires_grad_()

        def step(t, bn=bn):
            return F.relu(bn(t), inplace=True)

        y = (torch.compile(step) if compiled else step)(xi)
        assert y.is_contiguous(memory_format=fmt)
        y.square().sum().backward()
        out.append((y.detach(), xi.grad, bn.weight.grad, bn.group_sums.clone()))
    for eager, comp in zip(*out, strict=True):
        torch.testing.assert_close(eager, comp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_activations_with_fp32_parameters_match_the_per_group_reference(dtype):
    # under autocast BN sees half-precision activations and the fp32 master parameters
    n, c = 8, 4
    bn = make(c, n)
    x = torch.randn(3 * n, c, 4, 4).to(dtype).requires_grad_()
    y = bn(x)
    assert y.dtype == dtype
    ref = torch.cat(
        [
            F.batch_norm(p.float(), None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
            for p in x.detach().split(n)
        ]
    )
    torch.testing.assert_close(
        y.float(), ref, rtol=0, atol=2e-2 if dtype == torch.bfloat16 else 3e-3
    )
    y.float().sum().backward()
    assert x.grad.dtype == dtype and bn.weight.grad.dtype == torch.float32

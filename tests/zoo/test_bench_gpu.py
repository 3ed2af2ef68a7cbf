"""Smoke run of python -m benches.zoo.bench_gpu on CPU at tiny sizes (not a timed test): the
code that runs on a GPU runs here too, checks each backend against the first, and says why a
backend that cannot serve is left out."""

import pytest
import torch

from benches.zoo.bench_gpu import agree, main


def test_small_cpu_run_times_the_torch_paths_and_names_what_it_skips(capsys):
    main(["--device", "cpu", "--small", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "causal attention fwd+bwd" in out and "SSD fwd+bwd" in out
    assert "sdpa" in out and "reference" in out and "chunked" in out
    assert "FlexAttention has no backward on CPU" in out


def test_a_kernel_that_disagrees_with_the_reference_is_an_error():
    want = [torch.ones(4), torch.zeros(4)]
    agree("same", [w.clone() for w in want], want, 1e-3)
    with pytest.raises(AssertionError, match=r"attention bad: tensor 1 differs"):
        agree("attention bad", [want[0], torch.full((4,), 0.5)], want, 1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_cuda_asked_without_a_device_says_so():
    with pytest.raises(SystemExit, match="torch.cuda.is_available\\(\\) is False"):
        main([])

"""diffusers models through torch.compile as a user would call them (tiny random configs,
dynamic shapes): a VAE (group norms, 2x nearest upsampling, mid-block attention), a
conditional U-Net (time embedding, cross-attention, skip concatenations) and an
unconditional one (self-attention blocks in the down and up paths). Each runs wholly in
luminal and matches eager; none of luminal's passes was written for them."""

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import luminal.torch_backend as lt  # noqa: E402

pytestmark = pytest.mark.slow  # ~20-60 s a model: its compile


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


def _vae():
    m = diffusers.AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(16, 32),
                                down_block_types=("DownEncoderBlock2D",) * 2,
                                up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                                norm_num_groups=8, sample_size=16)  # fmt: skip
    return m, lambda b: (torch.randn(b, 3, 16, 16),), {}


def _cond_unet():
    m = diffusers.UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                                       layers_per_block=1, block_out_channels=(16, 32),
                                       down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                       up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                       cross_attention_dim=16, attention_head_dim=8,
                                       norm_num_groups=8)  # fmt: skip

    def inputs(b):
        return (torch.randn(b, 4, 8, 8), torch.tensor([10] * b)), \
            {"encoder_hidden_states": torch.randn(b, 5, 16)}  # fmt: skip

    return m, inputs, None


def _unet():
    m = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                              block_out_channels=(16, 32),
                              down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                              up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                              norm_num_groups=8)  # fmt: skip
    return m, lambda b: (torch.randn(b, 3, 8, 8), torch.tensor([10] * b)), {}


@pytest.mark.parametrize("make", [_vae, _cond_unet, _unet], ids=["vae", "cond_unet", "unet"])
def test_diffusers_model_runs_in_luminal_and_matches_eager(make):
    torch.manual_seed(0)
    m, inputs, kw = make()
    m = m.eval()
    f = torch.compile(m, backend="luminal", dynamic=True)
    with torch.no_grad():
        for b in (2, 3):
            args = inputs(b)
            if kw is None:  # the inputs give positional and keyword arguments
                args, extra = args
            else:
                extra = {}
            got, want = f(*args, **extra).sample, m(*args, **extra).sample
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert lt.stats.eager_ops == {} and lt.stats.failed_plans == 0

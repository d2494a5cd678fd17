"""The lines a learner types first (docs/architecture.md, section 7), end to end."""

import torch

import spyre_lab


class TinyMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


def test_learner_walkthrough():
    x = torch.randn(1024, 256, dtype=torch.float16).to("spyre")
    assert x.device == torch.device("spyre", 0)
    assert torch.spyre.memory_allocated() >= x.numel() * 2 and torch.spyre.device_count() >= 1
    y = torch.softmax(x, dim=-1).cpu()
    torch.testing.assert_close(y, torch.softmax(x.cpu().float(), dim=-1).half(), atol=2e-3, rtol=2e-2)
    assert spyre_lab.last_trace().duration_us > 0

    torch.manual_seed(0)
    model = TinyMLP().half().eval()
    inp = torch.randn(64, 128, dtype=torch.float16)
    expected = model(inp).detach()
    compiled = torch.compile(model.to("spyre"), backend="spyre")
    with torch.no_grad():
        out = compiled(inp.to("spyre"))
    trace = spyre_lab.last_trace()
    assert any(lane.startswith("core") for lane in trace.lanes())
    torch.testing.assert_close(out.cpu(), expected, atol=2e-2, rtol=2e-2)
    text = str(spyre_lab.explain(compiled))
    assert "kernel" in text.lower() and "LX" in text

"""A few optimizer steps (AdamW unless told) of a Hugging Face causal LM on fixed tokens: the training loop the torch tests share."""
import torch


def train_steps(model, ids, steps=3, lr=3e-3, optimizer=torch.optim.AdamW):
    """The loss before each of `steps` steps of `optimizer` (learning rate `lr`) on `ids` as input and labels."""
    opt = optimizer(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses

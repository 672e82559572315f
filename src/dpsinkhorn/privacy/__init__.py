"""The privacy mechanism (clip + noise, Poisson sampling), the accountant and the audit."""

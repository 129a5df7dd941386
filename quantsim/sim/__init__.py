"""The QuantizationSimModel facade, its quantizer objects, placement, config parsing and the sim graph builder."""

__all__: list[str] = []

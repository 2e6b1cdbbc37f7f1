package config

import (
	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/internal/yamlnode"
)

// PricesConfig is the prices section: what a million tokens of each kind
// cost per model, in one currency. Package policy checks it.
type PricesConfig struct {
	// Currency is the code of the currency prices and budgets are in,
	// such as USD or EUR: 3 upper-case letters.
	Currency string
	// Models lists each model's prices, in file order.
	Models []ModelPrice
	// Unknown prices the models Models does not list; nil (the file's
	// unknown: refuse, the default) refuses their requests.
	Unknown *ModelPrice
}

// ModelPrice is one model's prices per million tokens, as decimal numbers
// of the currency's units written in the file ("2.50"). CachedInput
// defaults to Input, Reasoning to Output, CacheWrite (input tokens
// written to the provider's prompt cache) to Input.
type ModelPrice struct {
	Model                                 string
	Input, CachedInput, Output, Reasoning string
	CacheWrite                            string
}

// UnknownRefuse, as prices.unknown, refuses requests for models the price
// table does not list.
const UnknownRefuse = "refuse"

func (w *walker) prices(path string, n *yaml.Node) *PricesConfig {
	pc := &PricesConfig{}
	w.mapping(n, path, "prices", []field{
		{"currency", func(p string, v *yaml.Node) { pc.Currency = w.str(p, v) }},
		{"models", func(p string, v *yaml.Node) {
			w.mapping(v, p, "prices.models", nil, func(name string, k, v *yaml.Node) {
				mp := join(p, name)
				w.keys[mp] = k
				w.nodes[mp] = yamlnode.Resolve(v)
				m := w.modelPrice(mp, v, "model "+quote(name))
				m.Model = name
				pc.Models = append(pc.Models, m)
			})
		}},
		{"unknown", func(p string, v *yaml.Node) {
			if r := yamlnode.Resolve(v); r.Kind == yaml.ScalarNode {
				if r.Value != UnknownRefuse {
					w.add(r, p, "unknown must be refuse or prices such as {input: 15, output: 75}, got "+quote(r.Value))
				}
				return
			}
			m := w.modelPrice(p, v, "prices.unknown")
			pc.Unknown = &m
		}},
	}, nil)
	return pc
}

func (w *walker) modelPrice(path string, n *yaml.Node, what string) ModelPrice {
	var m ModelPrice
	if r := yamlnode.Resolve(n); r.Kind != yaml.MappingNode {
		w.add(r, path, what+" must be a mapping such as {input: 2.50, output: 10}, got "+yamlnode.Describe(r))
		return m
	}
	w.mapping(n, path, what, []field{
		{"input", func(p string, v *yaml.Node) { m.Input = w.scalar(p, v) }},
		{"cached_input", func(p string, v *yaml.Node) { m.CachedInput = w.scalar(p, v) }},
		{"output", func(p string, v *yaml.Node) { m.Output = w.scalar(p, v) }},
		{"reasoning", func(p string, v *yaml.Node) { m.Reasoning = w.scalar(p, v) }},
		{"cache_write", func(p string, v *yaml.Node) { m.CacheWrite = w.scalar(p, v) }},
	}, nil)
	return m
}

package envoyxds

import (
	"fmt"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
)

// The RateLimitConfig resource is envoyproxy/ratelimit's YAML file as a
// message; these are that file's fields, so that a resource loads through
// the same parser, with the same checks, as a file.
type (
	yamlRoot struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value,omitempty"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
		ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
		QuotaMode      bool             `yaml:"quota_mode,omitempty"`
		Metadata       map[string]any   `yaml:"metadata,omitempty"`
	}
	yamlRateLimit struct {
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// maxDepth bounds the nesting converted, as the file parser bounds it.
const maxDepth = 64

func toYAML(rc *rlsconfv3.RateLimitConfig) ([]byte, error) {
	ds, err := descriptors(rc.GetDescriptors(), 0)
	if err != nil {
		return nil, err
	}
	return yaml.Marshal(yamlRoot{Domain: rc.GetDomain(), Descriptors: ds})
}

func descriptors(in []*rlsconfv3.RateLimitDescriptor, depth int) ([]yamlDescriptor, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if depth >= maxDepth {
		return nil, fmt.Errorf("descriptors nest deeper than %d levels", maxDepth)
	}
	out := make([]yamlDescriptor, len(in))
	for i, d := range in {
		sub, err := descriptors(d.GetDescriptors(), depth+1)
		if err != nil {
			return nil, err
		}
		out[i] = yamlDescriptor{Key: d.GetKey(), Value: d.GetValue(), Descriptors: sub,
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(), QuotaMode: d.GetQuotaMode()}
		if m := d.GetMetadata(); m != nil {
			out[i].Metadata = m.AsMap()
		}
		if p := d.GetRateLimit(); p != nil {
			rl := &yamlRateLimit{Name: p.GetName(), Unlimited: p.GetUnlimited()}
			if p.GetUnit() != rlsconfv3.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
				// An unlimited policy comes with no unit; any other
				// needs one, and an UNKNOWN unit is refused by name.
				rl.Unit = p.GetUnit().String()
				n := p.GetRequestsPerUnit()
				rl.RequestsPerUnit = &n
			}
			for _, r := range p.GetReplaces() {
				rl.Replaces = append(rl.Replaces, yamlReplace{Name: r.GetName()})
			}
			out[i].RateLimit = rl
		}
	}
	return out, nil
}

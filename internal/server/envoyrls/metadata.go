package envoyrls

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir/internal/yamlnode"
)

// WithDynamicMetadata makes every response carry dynamic metadata, as
// envoyproxy/ratelimit does with RESPONSE_DYNAMIC_METADATA=true (weir
// serve: --envoy-dynamic-metadata): the domain, each descriptor's entries
// ("key=value"), override limit and hits_addend, the call's hits_addend,
// and the merged metadata: of the rules of the descriptors that passed.
func WithDynamicMetadata(on bool) Option { return func(s *Service) { s.dynamicMetadata = on } }

// metadataOf reads a descriptor's metadata: mapping into a Struct. Scalars
// are read as envoyproxy/ratelimit's YAML 1.1 reader reads them: numbers,
// true/false (and yes/no/on/off unquoted), null, and strings for the rest.
func metadataOf(n *yaml.Node) (*structpb.Struct, error) {
	if yamlnode.IsNull(n) {
		return nil, nil
	}
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.MappingNode {
		return nil, yamlnode.Errorf(n, "metadata must be a mapping, got %s", yamlnode.Describe(n))
	}
	v, err := metadataValue(n, 0)
	if err != nil {
		return nil, err
	}
	s := v.GetStructValue()
	if len(s.GetFields()) == 0 {
		return nil, nil
	}
	return s, nil
}

// maxMetadataDepth bounds how deep metadata nests.
const maxMetadataDepth = 32

func metadataValue(n *yaml.Node, depth int) (*structpb.Value, error) {
	n = yamlnode.Resolve(n)
	if depth > maxMetadataDepth {
		return nil, yamlnode.Errorf(n, "metadata nests deeper than %d levels", maxMetadataDepth)
	}
	switch n.Kind {
	case yaml.MappingNode:
		fields := make(map[string]*structpb.Value, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := yamlnode.Resolve(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				return nil, yamlnode.Errorf(k, "a metadata key must be a scalar, got %s", yamlnode.Describe(k))
			}
			v, err := metadataValue(n.Content[i+1], depth+1)
			if err != nil {
				return nil, err
			}
			fields[k.Value] = v
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields}), nil
	case yaml.SequenceNode:
		vals := make([]*structpb.Value, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := metadataValue(c, depth+1)
			if err != nil {
				return nil, err
			}
			vals = append(vals, v)
		}
		return structpb.NewListValue(&structpb.ListValue{Values: vals}), nil
	case yaml.ScalarNode:
		return scalarValue(n), nil
	}
	return nil, yamlnode.Errorf(n, "metadata holds %s, which has no JSON form", yamlnode.Describe(n))
}

func scalarValue(n *yaml.Node) *structpb.Value {
	if n.Style == 0 {
		if n.ShortTag() == "!!bool" || isYAML11Bool(n.Value) {
			if b, err := yamlnode.BoolYAML11(n, "metadata"); err == nil {
				return structpb.NewBoolValue(b)
			}
		}
		switch n.ShortTag() {
		case "!!null":
			return structpb.NewNullValue()
		case "!!int":
			if i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
				return structpb.NewNumberValue(float64(i))
			}
		case "!!float":
			var f float64
			if err := n.Decode(&f); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
				return structpb.NewNumberValue(f)
			}
		}
	}
	return structpb.NewStringValue(n.Value)
}

func isYAML11Bool(s string) bool {
	switch s {
	case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF":
		return true
	}
	return false
}

// responseMetadata is the dynamic metadata of a response, in
// envoyproxy/ratelimit's shape: passed[i] says descriptor i passed (it is
// neither over the limit nor unlimited), and meta[i] is the metadata of
// the rule that decided it.
func responseMetadata(req *rlspb.RateLimitRequest, passed []bool, meta []*structpb.Struct) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		descs = append(descs, structpb.NewStructValue(descriptorStruct(d)))
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, ok := range passed {
		if ok && meta[i] != nil {
			mergeMetadata(merged, meta[i])
		}
	}
	if len(merged.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

func descriptorStruct(d *rlcommon.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		entries = append(entries, structpb.NewStringValue(fmt.Sprintf("%s=%s", e.GetKey(), e.GetValue())))
	}
	fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		fields["limit"] = structpb.NewStringValue(l.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata adds src's fields to dst: a field dst already has is kept,
// except that two mappings merge, recursively. dst never shares a value
// with src, so that merging never changes a configuration's metadata.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		dv, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if ds, ss := dv.GetStructValue(), v.GetStructValue(); ds != nil && ss != nil {
			mergeMetadata(ds, ss)
		}
	}
}

package envoyrls

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxJSONBody is the largest request body CheckJSON accepts.
const MaxJSONBody = 64 << 10

// CheckJSON decides a RateLimitRequest written in JSON, for the HTTP check
// API: {"domain": "rl", "descriptors": [{"entries": [{"key": "k", "value":
// "v"}], "hits_addend": 2}], "hits_addend": 1}. Field names may be written
// as in the proto (hits_addend) or in camel case (hitsAddend); unknown
// fields are refused.
//
// It returns the RateLimitResponse in the proto's JSON mapping, as
// envoyproxy/ratelimit's /json endpoint does ({"overallCode": "OK",
// "statuses": [...]}), with status 200 when the call is within its limits
// and 429 when it is over. On error it returns a JSON body
// {"error": "..."} naming the problem, the status to send (400 for a bad
// request, a call over the bounds of one call, or a limit or cost the
// store refused as invalid; 413 for a body over MaxJSONBody; 503 for a
// store failure) and the error itself.
func (s *Service) CheckJSON(ctx context.Context, body []byte) (respJSON []byte, status int, err error) {
	if len(body) > MaxJSONBody {
		err = fmt.Errorf("%w: the body is %d bytes, over the limit of %d", ErrBadRequest, len(body), MaxJSONBody)
		return errorJSON(err), http.StatusRequestEntityTooLarge, err
	}
	var req rlspb.RateLimitRequest
	if uerr := protojson.Unmarshal(body, &req); uerr != nil {
		err = fmt.Errorf("%w: %v", ErrBadRequest, uerr)
		return errorJSON(err), http.StatusBadRequest, err
	}
	resp, err := s.Check(ctx, &req)
	if err != nil {
		status = http.StatusServiceUnavailable
		if badInput(err) {
			status = http.StatusBadRequest
		}
		return errorJSON(err), status, err
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		return errorJSON(err), http.StatusInternalServerError, err
	}
	if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		return out, http.StatusTooManyRequests, nil
	}
	return out, http.StatusOK, nil
}

func errorJSON(err error) []byte {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{err.Error()})
	return b
}

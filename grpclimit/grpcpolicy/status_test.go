package grpcpolicy

import (
	"testing"

	"google.golang.org/grpc/codes"
)

// The codes map to HTTP statuses as Google APIs and grpc-gateway map them.
func TestHTTPStatus(t *testing.T) {
	want := map[codes.Code]int{
		codes.OK:                 200,
		codes.Canceled:           499,
		codes.Unknown:            500,
		codes.InvalidArgument:    400,
		codes.DeadlineExceeded:   504,
		codes.NotFound:           404,
		codes.AlreadyExists:      409,
		codes.PermissionDenied:   403,
		codes.ResourceExhausted:  429,
		codes.FailedPrecondition: 400,
		codes.Aborted:            409,
		codes.OutOfRange:         400,
		codes.Unimplemented:      501,
		codes.Internal:           500,
		codes.Unavailable:        503,
		codes.DataLoss:           500,
		codes.Unauthenticated:    401,
		codes.Code(99):           500,
	}
	for c, st := range want {
		if got := httpStatus(c); got != st {
			t.Errorf("httpStatus(%v) = %d, want %d", c, got, st)
		}
	}
}

package algorithm

// Unexported names the external tests use.

const FeatureShaping = featureShaping

var (
	DebitTake  = debitTake
	CreditTake = creditTake
	Refund     = refundTake
)

func (l *Log) Cap() int { return l.capacity() }

func (l *Log) Events() int64 { return l.events() }

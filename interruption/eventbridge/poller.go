package eventbridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/fleetd/fleetd/internal/ctxtime"
)

// SQSAPI is the part of the SQS client the Poller uses; *sqs.Client
// implements it.
type SQSAPI interface {
	GetQueueUrl(context.Context, *sqs.GetQueueUrlInput, ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(context.Context, *sqs.DeleteMessageInput, ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
}

// Handler acts on one event. It returns handled=false when the event is
// about no instance it manages (EventBridge rules cannot filter by tag, so
// the queue gets every interruption in the account and region); the
// message is deleted either way. An error keeps the message in the queue:
// SQS delivers it again after the visibility timeout.
type Handler func(ctx context.Context, ev Event) (handled bool, err error)

// Defaults of Poller, as NTH and Karpenter consume the same queues.
const (
	DefaultMaxMessages       = 10
	DefaultWaitTime          = 20 * time.Second // SQS's longest long poll
	DefaultVisibilityTimeout = 20 * time.Second
	DefaultMinBackoff        = time.Second
	DefaultMaxBackoff        = 30 * time.Second
)

// Poller long-polls one SQS queue and hands each event to Handler.
type Poller struct {
	Client SQSAPI
	// Queue is the queue URL, or a name to resolve with GetQueueUrl.
	Queue   string
	Handler Handler
	// MaxMessages per ReceiveMessage (1–10); default 10.
	MaxMessages int32
	// WaitTime is the long-poll wait (0–20 s, whole seconds); default 20 s.
	WaitTime time.Duration
	// VisibilityTimeout is how long a received message stays hidden; a
	// message whose handler failed comes back after it. Default 20 s.
	VisibilityTimeout time.Duration
	// MinBackoff and MaxBackoff bound the pause after an SQS error, which
	// doubles per consecutive error; defaults 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives one line per error and per discarded message; nil
	// discards.
	Logger *slog.Logger

	received, handled, ignored, unparseable, errs atomic.Uint64
}

// Stats are the Poller's counters since it was created.
type Stats struct {
	Received    uint64 // messages received
	Handled     uint64 // events the handler acted on (message deleted)
	Ignored     uint64 // events about no managed instance or not notices (deleted)
	Unparseable uint64 // malformed messages (deleted)
	Errors      uint64 // handler errors (message kept) and SQS call failures
}

// Stats returns the counters.
func (p *Poller) Stats() Stats {
	return Stats{
		Received: p.received.Load(), Handled: p.handled.Load(), Ignored: p.ignored.Load(),
		Unparseable: p.unparseable.Load(), Errors: p.errs.Load(),
	}
}

func (p *Poller) logger() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Run polls until ctx is done and then returns nil. It returns an error
// only when it cannot start: no client or handler, or a queue that does
// not exist or may not be read. Other SQS errors are retried with backoff.
func (p *Poller) Run(ctx context.Context) error {
	if p.Client == nil || p.Handler == nil || p.Queue == "" {
		return errors.New("eventbridge poller: Client, Handler and Queue are required")
	}
	url, err := p.resolve(ctx)
	if err != nil || url == "" {
		return err
	}
	maxN := p.MaxMessages
	if maxN <= 0 || maxN > 10 {
		maxN = DefaultMaxMessages
	}
	wait := p.WaitTime
	if wait <= 0 || wait > DefaultWaitTime {
		wait = DefaultWaitTime
	}
	vis := p.VisibilityTimeout
	if vis <= 0 {
		vis = DefaultVisibilityTimeout
	}
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(url),
		MaxNumberOfMessages:         maxN,
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(max(vis/time.Second, 1)),
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameSentTimestamp, types.MessageSystemAttributeNameApproximateReceiveCount},
	}
	bo := p.newBackoff()
	for ctx.Err() == nil {
		out, err := p.Client.ReceiveMessage(ctx, in)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			p.errs.Add(1)
			d := bo.next()
			p.logger().Warn("sqs receive failed", "queue", url, "err", err, "retry_in", d)
			if ctxtime.Sleep(ctx, d) != nil {
				break
			}
			continue
		}
		bo.reset()
		var wg sync.WaitGroup
		for _, m := range out.Messages {
			wg.Go(func() { p.process(ctx, url, m) })
		}
		wg.Wait()
	}
	return nil
}

// resolve returns the queue URL, looking a name up with GetQueueUrl and
// retrying errors other than a missing queue or denied access. It returns
// "" and nil when ctx ends first.
func (p *Poller) resolve(ctx context.Context) (string, error) {
	if strings.HasPrefix(p.Queue, "https://") || strings.HasPrefix(p.Queue, "http://") {
		return p.Queue, nil
	}
	bo := p.newBackoff()
	for ctx.Err() == nil {
		out, err := p.Client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(p.Queue)})
		if err == nil {
			return aws.ToString(out.QueueUrl), nil
		}
		if ctx.Err() != nil {
			break
		}
		var missing *types.QueueDoesNotExist
		var ae smithy.APIError
		if errors.As(err, &missing) || errors.As(err, &ae) && (ae.ErrorCode() == "AccessDenied" || ae.ErrorCode() == "AccessDeniedException") {
			return "", fmt.Errorf("eventbridge poller: queue %q: %w", p.Queue, err)
		}
		p.errs.Add(1)
		d := bo.next()
		p.logger().Warn("sqs GetQueueUrl failed", "queue", p.Queue, "err", err, "retry_in", d)
		if ctxtime.Sleep(ctx, d) != nil {
			break
		}
	}
	return "", nil
}

// process handles one message and deletes it unless the handler failed.
func (p *Poller) process(ctx context.Context, url string, m types.Message) {
	p.received.Add(1)
	log := p.logger().With("queue", url, "message_id", aws.ToString(m.MessageId))
	ev, err := Parse([]byte(aws.ToString(m.Body)))
	switch {
	case errors.Is(err, ErrIgnored):
		p.ignored.Add(1)
	case err != nil:
		p.unparseable.Add(1)
		log.Warn("deleting unparseable interruption message", "err", err)
	default:
		handled, err := p.Handler(ctx, ev)
		if err != nil {
			p.errs.Add(1)
			log.Warn("interruption handler failed; the message will be redelivered", "event_id", ev.ID, "err", err)
			return
		}
		if handled {
			p.handled.Add(1)
		} else {
			p.ignored.Add(1)
		}
	}
	// The event is dealt with: delete it even if the poller is stopping,
	// so it is not handled again after a restart.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := p.Client.DeleteMessage(dctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
		p.errs.Add(1)
		log.Warn("sqs delete failed; the message will be redelivered", "err", err)
	}
}

type backoff struct{ min, max, cur time.Duration }

func (p *Poller) newBackoff() *backoff {
	b := &backoff{min: p.MinBackoff, max: p.MaxBackoff}
	if b.min <= 0 {
		b.min = DefaultMinBackoff
	}
	if b.max < b.min {
		b.max = max(DefaultMaxBackoff, b.min)
	}
	return b
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

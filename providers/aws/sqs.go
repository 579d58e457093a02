package aws

import (
	"context"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/fleetd/fleetd/providers"
)

// InterruptionQueue is one SQS queue fed by EventBridge interruption rules.
type InterruptionQueue struct {
	Region string
	// Queue is a queue name or URL (interruption/eventbridge.Poller
	// resolves names with GetQueueUrl).
	Queue string
}

// InterruptionQueues returns the queues the daemon should poll for a
// block. EventBridge rules are regional, so a queue name means a queue of
// that name in every region of the block; a queue URL names one queue, in
// the region of its host (sqs.REGION.amazonaws.com), or the block's first
// region for other hosts (VPC endpoints, tests). Nil when the block has no
// interruption_queue.
func InterruptionQueues(cfg providers.Config) ([]InterruptionQueue, error) {
	b, err := decodeBlock(cfg)
	if err != nil {
		return nil, err
	}
	q := b.InterruptionQueue
	if q == "" {
		return nil, nil
	}
	if u, err := url.Parse(q); err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" {
		region := b.Regions[0]
		host := strings.Split(u.Hostname(), ".")
		if len(host) >= 3 && host[0] == "sqs" {
			region = host[1]
		}
		return []InterruptionQueue{{Region: region, Queue: q}}, nil
	}
	out := make([]InterruptionQueue, 0, len(b.Regions))
	for _, r := range b.Regions {
		out = append(out, InterruptionQueue{Region: r, Queue: q})
	}
	return out, nil
}

// NewSQSClient returns an SQS client for the block's credentials (profile
// or the default chain) in region, with sqs_endpoint as BaseEndpoint when
// set. It is for the daemon's interruption intake, which runs in the
// daemon process, not in the provider plugin.
func NewSQSClient(ctx context.Context, cfg providers.Config, region string) (*sqs.Client, error) {
	b, err := decodeBlock(cfg)
	if err != nil {
		return nil, err
	}
	awsCfg, err := loadConfig(ctx, b.Profile, region, DefaultRetryMaxAttempts, nil)
	if err != nil {
		return nil, err
	}
	return sqs.NewFromConfig(awsCfg, func(o *sqs.Options) { setEndpoint(&o.BaseEndpoint, b.SQSEndpoint) }), nil
}

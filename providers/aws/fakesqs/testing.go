package fakesqs

import (
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// StartT serves a new fake with the named queues for the rest of the test
// and returns it with its URL.
func StartT(t testing.TB, queues ...string) (*Server, string) {
	t.Helper()
	s := New(Options{})
	for _, q := range queues {
		s.CreateQueue(q)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

// NewClient is the real SDK's SQS client pointed at a fake at url, with a
// static test key and SDK retries off, so its caller sees every error the
// fake answers.
func NewClient(url string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(url),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""),
		RetryMaxAttempts: 1,
	})
}

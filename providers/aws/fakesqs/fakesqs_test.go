package fakesqs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers/aws/fakesqs"
)

func setup(t *testing.T) (*fakesqs.Server, *sqs.Client, string) {
	t.Helper()
	fake, url := fakesqs.StartT(t, "q")
	client := fakesqs.NewClient(url)
	ctx := ctxT(t)
	out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("q")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := aws.ToString(out.QueueUrl), fake.QueueURL(url, "q"); got != want {
		t.Fatalf("queue url %s, want %s", got, want)
	}
	return fake, client, aws.ToString(out.QueueUrl)
}

func ctxT(t *testing.T) context.Context { return testutil.Context(t, 15*time.Second) }

// TestSendReceiveDelete goes through the real SDK, which checks the MD5
// digests the fake computes.
func TestSendReceiveDelete(t *testing.T) {
	fake, c, url := setup(t)
	ctx := ctxT(t)
	sent, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(`{"hello":"wörld"}`)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 {
		t.Fatalf("%d messages", len(out.Messages))
	}
	m := out.Messages[0]
	if aws.ToString(m.MessageId) != aws.ToString(sent.MessageId) || aws.ToString(m.Body) != `{"hello":"wörld"}` || m.Attributes["ApproximateReceiveCount"] != "1" || m.Attributes["SentTimestamp"] == "" {
		t.Errorf("received %+v", m)
	}
	if v, f := fake.Counts("q"); v != 0 || f != 1 {
		t.Errorf("counts visible %d in flight %d, want 0/1", v, f)
	}
	if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	if v, f := fake.Counts("q"); v+f != 0 {
		t.Errorf("message survived its delete")
	}
}

func TestLongPollWakesOnSend(t *testing.T) {
	fake, c, url := setup(t)
	ctx := ctxT(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = fake.Send("q", "late")
	}()
	start := time.Now()
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 20, MaxNumberOfMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || time.Since(start) > 15*time.Second {
		t.Fatalf("long poll returned %d messages after %v, want the late message before the wait ended", len(out.Messages), time.Since(start))
	}
	// An empty queue with no wait answers at once with no messages.
	out, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url)})
	if err != nil || len(out.Messages) != 0 {
		t.Errorf("short poll of an empty queue: %v, %v", out.Messages, err)
	}
}

func TestVisibilityTimeout(t *testing.T) {
	fake, c, url := setup(t)
	ctx := ctxT(t)
	if _, err := fake.Send("q", "m"); err != nil {
		t.Fatal(err)
	}
	first, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), VisibilityTimeout: 1})
	if err != nil || len(first.Messages) != 1 {
		t.Fatalf("first receive: %v, %v", first, err)
	}
	hidden, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url)})
	if err != nil || len(hidden.Messages) != 0 {
		t.Fatalf("message visible while in flight: %v, %v", hidden, err)
	}
	// It comes back after the timeout; a long poll waits for that.
	again, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 5,
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}})
	if err != nil || len(again.Messages) != 1 {
		t.Fatalf("redelivery: %v, %v", again, err)
	}
	m := again.Messages[0]
	if m.Attributes["ApproximateReceiveCount"] != "2" || aws.ToString(m.ReceiptHandle) == aws.ToString(first.Messages[0].ReceiptHandle) {
		t.Errorf("redelivered %+v, want receive count 2 and a new receipt handle", m)
	}
	// The stale handle succeeds but deletes nothing, as SQS documents.
	if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: first.Messages[0].ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	if v, f := fake.Counts("q"); v+f != 1 {
		t.Error("stale receipt handle deleted the message")
	}
}

func TestErrors(t *testing.T) {
	fake, c, url := setup(t)
	ctx := ctxT(t)
	_, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("nope")})
	var missing *types.QueueDoesNotExist
	if !errors.As(err, &missing) || missing.ErrorCode() != "AWS.SimpleQueueService.NonExistentQueue" {
		t.Errorf("unknown queue: %v, want QueueDoesNotExist with the query-compatible code", err)
	}
	_, err = c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: aws.String("bogus")})
	var invalid *types.ReceiptHandleIsInvalid
	if !errors.As(err, &invalid) {
		t.Errorf("bogus receipt handle: %v", err)
	}
	_, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 11})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidParameterValue" {
		t.Errorf("11 messages: %v", err)
	}
	fake.FailNext("ReceiveMessage", "RequestThrottled", 1)
	_, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url)})
	var throttled *types.RequestThrottled
	if !errors.As(err, &throttled) {
		t.Errorf("scripted throttle: %v", err)
	}
	if got := fake.Calls("ReceiveMessage"); got != 2 {
		t.Errorf("ReceiveMessage calls %d, want 2", got)
	}
}

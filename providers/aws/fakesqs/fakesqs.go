// Package fakesqs is an in-process Amazon SQS endpoint for tests: an
// http.Handler speaking the SQS JSON protocol (POST /, Content-Type
// application/x-amz-json-1.0, X-Amz-Target: AmazonSQS.<Operation>, JSON
// bodies, errors as {"__type": …, "message": …} plus the
// X-Amzn-Query-Error header SQS sends for query-compatible clients), so the
// real aws-sdk-go-v2 SQS client, pointed at it with BaseEndpoint, works
// unchanged.
//
// It implements what an EventBridge consumer needs: GetQueueUrl,
// GetQueueAttributes (message counts),
// ReceiveMessage (MaxNumberOfMessages, long polling with WaitTimeSeconds,
// visibility timeouts, receipt handles, system attributes), DeleteMessage,
// and SendMessage for tests to enqueue events.
package fakesqs

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures a Server.
type Options struct {
	// AccountID is the queue owner in queue URLs; default "123456789012".
	AccountID string
	// VisibilityTimeout is a queue's default visibility timeout; default
	// 30 s, SQS's default.
	VisibilityTimeout time.Duration
}

// Server is the fake SQS endpoint. Use it with httptest.NewServer(s). It is
// safe for concurrent use.
type Server struct {
	opts Options

	mu       sync.Mutex
	seq      uint64
	queues   map[string]*queue
	changed  chan struct{} // closed and replaced whenever a message may have become receivable
	scripted map[string][]apiError
	calls    map[string]int
	last     map[string]map[string]any
}

type queue struct {
	name       string
	visibility time.Duration
	msgs       []*message
}

type message struct {
	id, body, handle string
	sent, firstRecv  time.Time
	visibleAt        time.Time
	receives         int
}

// New returns a Server with no queues.
func New(opts Options) *Server {
	if opts.AccountID == "" {
		opts.AccountID = "123456789012"
	}
	if opts.VisibilityTimeout <= 0 {
		opts.VisibilityTimeout = 30 * time.Second
	}
	return &Server{
		opts: opts, queues: map[string]*queue{}, changed: make(chan struct{}),
		scripted: map[string][]apiError{}, calls: map[string]int{}, last: map[string]map[string]any{},
	}
}

// CreateQueue creates queue name (no-op if it exists) with the server's
// default visibility timeout.
func (s *Server) CreateQueue(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.queues[name]; !ok {
		s.queues[name] = &queue{name: name, visibility: s.opts.VisibilityTimeout}
	}
}

// QueueURL is the URL of queue name on a server reachable at baseURL
// (httptest.Server.URL), the form GetQueueUrl returns.
func (s *Server) QueueURL(baseURL, name string) string {
	return strings.TrimSuffix(baseURL, "/") + "/" + s.opts.AccountID + "/" + name
}

// Send enqueues a message directly (the test's stand-in for EventBridge)
// and returns its message id.
func (s *Server) Send(name, body string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[name]
	if !ok {
		return "", fmt.Errorf("fakesqs: no queue %q", name)
	}
	return s.sendLocked(q, body, time.Now()), nil
}

func (s *Server) sendLocked(q *queue, body string, now time.Time) string {
	s.seq++
	id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", s.seq, s.seq%0xffff, s.seq%0xfff, s.seq%0xfff, s.seq)
	q.msgs = append(q.msgs, &message{id: id, body: body, sent: now, visibleAt: now})
	s.notifyLocked()
	return id
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Counts reports how many messages of queue name are visible and in flight
// (SQS's ApproximateNumberOfMessages and …NotVisible).
func (s *Server) Counts(name string) (visible, inFlight int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[name]
	if !ok {
		return 0, 0
	}
	now := time.Now()
	for _, m := range q.msgs {
		if now.Before(m.visibleAt) {
			inFlight++
		} else {
			visible++
		}
	}
	return visible, inFlight
}

// FailNext makes the next n calls of operation (e.g. "ReceiveMessage")
// fail with the given error code (e.g. "RequestThrottled",
// "InternalError"), in SQS's JSON error shape.
func (s *Server) FailNext(operation, code string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.scripted[operation] = append(s.scripted[operation], apiError{code: code, message: "injected by fakesqs"})
	}
}

// Calls returns how many calls of operation the server has answered.
func (s *Server) Calls(operation string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[operation]
}

// LastRequest returns the decoded JSON body of the last call of operation.
func (s *Server) LastRequest(operation string) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[operation]
}

// apiError is an SQS error: code is the JSON __type (without namespace),
// query the legacy query-protocol code for X-Amzn-Query-Error.
type apiError struct {
	code, query, message string
	status               int
}

var (
	errNoQueue = apiError{code: "QueueDoesNotExist", query: "AWS.SimpleQueueService.NonExistentQueue", message: "The specified queue does not exist.", status: http.StatusBadRequest}
)

func invalidParam(format string, args ...any) *apiError {
	return &apiError{code: "InvalidParameterValue", query: "InvalidParameterValue", message: fmt.Sprintf(format, args...), status: http.StatusBadRequest}
}

// statusOf is SQS's HTTP status for scripted codes.
func statusOf(code string) int {
	switch code {
	case "RequestThrottled", "OverLimit":
		return http.StatusForbidden
	case "ReceiptHandleIsInvalid", "InvalidAddress":
		return http.StatusNotFound
	case "InternalError", "InternalFailure":
		return http.StatusInternalServerError
	case "ServiceUnavailable":
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

func writeError(w http.ResponseWriter, e apiError) {
	if e.status == 0 {
		e.status = statusOf(e.code)
	}
	if e.query == "" {
		e.query = e.code
	}
	fault := "Sender"
	if e.status >= 500 {
		fault = "Receiver"
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Query-Error", e.query+";"+fault)
	w.Header().Set("X-Amzn-Requestid", "fakesqs-error")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + e.code, "message": e.message})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Requestid", "fakesqs")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}

// ServeHTTP answers one SQS JSON-protocol request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	target := r.Header.Get("X-Amz-Target")
	op, ok := strings.CutPrefix(target, "AmazonSQS.")
	if r.Method != http.MethodPost || !ok || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-amz-json-1.0") {
		writeError(w, apiError{code: "UnknownOperationException", message: fmt.Sprintf("unsupported request %s %q", r.Method, target), status: http.StatusBadRequest})
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		writeError(w, apiError{code: "MissingAuthenticationToken", message: "Request is missing Authentication Token", status: http.StatusBadRequest})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, *invalidParam("read body: %v", err))
		return
	}
	var decoded map[string]any
	_ = json.Unmarshal(body, &decoded)
	s.mu.Lock()
	s.calls[op]++
	s.last[op] = decoded
	if q := s.scripted[op]; len(q) > 0 {
		s.scripted[op] = q[1:]
		s.mu.Unlock()
		writeError(w, q[0])
		return
	}
	s.mu.Unlock()

	serve, ok := operations[op]
	if !ok {
		writeError(w, apiError{code: "UnsupportedOperation", message: op + " is not implemented by fakesqs"})
		return
	}
	out, e := serve(s, r, body)
	switch {
	case e != nil:
		writeError(w, *e)
	case out != nil: // nil: the client went away during a long poll
		writeJSON(w, out)
	}
}

// operations are the SQS operations the fake serves, each answering its
// JSON result or an SQS error.
var operations = map[string]func(s *Server, r *http.Request, body []byte) (any, *apiError){
	"GetQueueUrl":        operation((*Server).getQueueURL),
	"SendMessage":        operation((*Server).sendMessage),
	"ReceiveMessage":     operation((*Server).receiveMessage),
	"DeleteMessage":      operation((*Server).deleteMessage),
	"GetQueueAttributes": operation((*Server).getQueueAttributes),
}

// operation decodes a request body into the handler's input first,
// answering SerializationException when it is not that JSON.
func operation[In any](h func(s *Server, r *http.Request, in *In) (any, *apiError)) func(*Server, *http.Request, []byte) (any, *apiError) {
	return func(s *Server, r *http.Request, body []byte) (any, *apiError) {
		var in In
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, &apiError{code: "SerializationException", message: err.Error(), status: http.StatusBadRequest}
		}
		return h(s, r, &in)
	}
}

// queueLocked finds the queue a QueueUrl names (by its last path segment).
func (s *Server) queueLocked(url string) (*queue, *apiError) {
	if url == "" {
		return nil, invalidParam("QueueUrl is required")
	}
	name := url[strings.LastIndex(url, "/")+1:]
	q, ok := s.queues[name]
	if !ok {
		e := errNoQueue
		return nil, &e
	}
	return q, nil
}

type queueNameInput struct {
	QueueName string `json:"QueueName"`
}

func (s *Server) getQueueURL(r *http.Request, in *queueNameInput) (any, *apiError) {
	s.mu.Lock()
	_, ok := s.queues[in.QueueName]
	s.mu.Unlock()
	if !ok {
		e := errNoQueue
		return nil, &e
	}
	return map[string]string{"QueueUrl": s.QueueURL("http://"+r.Host, in.QueueName)}, nil
}

type queueInput struct {
	QueueURL string `json:"QueueUrl"`
}

// getQueueAttributes answers the message counts (what a preflight reads
// to prove the queue is readable without consuming a message).
func (s *Server) getQueueAttributes(_ *http.Request, in *queueInput) (any, *apiError) {
	s.mu.Lock()
	q, e := s.queueLocked(in.QueueURL)
	s.mu.Unlock()
	if e != nil {
		return nil, e
	}
	visible, inFlight := s.Counts(q.name)
	return map[string]map[string]string{"Attributes": {
		"ApproximateNumberOfMessages":           strconv.Itoa(visible),
		"ApproximateNumberOfMessagesNotVisible": strconv.Itoa(inFlight),
	}}, nil
}

func md5Hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

type sendInput struct {
	QueueURL    string `json:"QueueUrl"`
	MessageBody string `json:"MessageBody"`
}

func (s *Server) sendMessage(_ *http.Request, in *sendInput) (any, *apiError) {
	if in.MessageBody == "" {
		return nil, invalidParam("The request must contain the parameter MessageBody.")
	}
	s.mu.Lock()
	q, e := s.queueLocked(in.QueueURL)
	if e != nil {
		s.mu.Unlock()
		return nil, e
	}
	id := s.sendLocked(q, in.MessageBody, time.Now())
	s.mu.Unlock()
	return map[string]string{"MessageId": id, "MD5OfMessageBody": md5Hex(in.MessageBody)}, nil
}

type receiveInput struct {
	QueueURL                    string   `json:"QueueUrl"`
	MaxNumberOfMessages         *int     `json:"MaxNumberOfMessages"`
	WaitTimeSeconds             *int     `json:"WaitTimeSeconds"`
	VisibilityTimeout           *int     `json:"VisibilityTimeout"`
	AttributeNames              []string `json:"AttributeNames"`
	MessageSystemAttributeNames []string `json:"MessageSystemAttributeNames"`
}

type wireMessage struct {
	MessageID     string            `json:"MessageId"`
	ReceiptHandle string            `json:"ReceiptHandle"`
	MD5OfBody     string            `json:"MD5OfBody"`
	Body          string            `json:"Body"`
	Attributes    map[string]string `json:"Attributes,omitempty"`
}

func (s *Server) receiveMessage(r *http.Request, in *receiveInput) (any, *apiError) {
	maxN := 1
	if in.MaxNumberOfMessages != nil {
		maxN = *in.MaxNumberOfMessages
		if maxN < 1 || maxN > 10 {
			return nil, invalidParam("Value %d for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided.", maxN)
		}
	}
	wait := 0
	if in.WaitTimeSeconds != nil {
		wait = *in.WaitTimeSeconds
		if wait < 0 || wait > 20 {
			return nil, invalidParam("Value %d for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, if provided.", wait)
		}
	}
	if in.VisibilityTimeout != nil && (*in.VisibilityTimeout < 0 || *in.VisibilityTimeout > 43200) {
		return nil, invalidParam("Value %d for parameter VisibilityTimeout is invalid. Reason: Must be >= 0 and <= 43200, if provided.", *in.VisibilityTimeout)
	}
	attrs := append(slices.Clone(in.AttributeNames), in.MessageSystemAttributeNames...)
	deadline := time.Now().Add(time.Duration(wait) * time.Second)
	for {
		s.mu.Lock()
		q, e := s.queueLocked(in.QueueURL)
		if e != nil {
			s.mu.Unlock()
			return nil, e
		}
		now := time.Now()
		visibility := q.visibility
		if in.VisibilityTimeout != nil {
			visibility = time.Duration(*in.VisibilityTimeout) * time.Second
		}
		var out []wireMessage
		nextVisible := time.Time{}
		for _, m := range q.msgs {
			if now.Before(m.visibleAt) {
				if nextVisible.IsZero() || m.visibleAt.Before(nextVisible) {
					nextVisible = m.visibleAt
				}
				continue
			}
			if len(out) == maxN {
				break
			}
			m.receives++
			if m.firstRecv.IsZero() {
				m.firstRecv = now
			}
			m.visibleAt = now.Add(visibility)
			s.seq++
			m.handle = "AQEB" + strings.ReplaceAll(m.id, "-", "") + strconv.FormatUint(s.seq, 36)
			out = append(out, wireMessage{MessageID: m.id, ReceiptHandle: m.handle, MD5OfBody: md5Hex(m.body), Body: m.body, Attributes: systemAttributes(m, attrs)})
		}
		changed := s.changed
		s.mu.Unlock()
		if len(out) > 0 || !now.Before(deadline) {
			if len(out) == 0 {
				return map[string]any{}, nil // SQS leaves Messages out when there are none
			}
			return map[string]any{"Messages": out}, nil
		}
		// Long poll: wake on a new message, a visibility timeout running
		// out, the wait ending, or the client going away.
		wake := deadline
		if !nextVisible.IsZero() && nextVisible.Before(wake) {
			wake = nextVisible
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-changed:
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return nil, nil
		}
		t.Stop()
	}
}

func systemAttributes(m *message, names []string) map[string]string {
	want := func(n string) bool { return slices.Contains(names, "All") || slices.Contains(names, n) }
	out := map[string]string{}
	if want("ApproximateReceiveCount") {
		out["ApproximateReceiveCount"] = strconv.Itoa(m.receives)
	}
	if want("SentTimestamp") {
		out["SentTimestamp"] = strconv.FormatInt(m.sent.UnixMilli(), 10)
	}
	if want("ApproximateFirstReceiveTimestamp") {
		out["ApproximateFirstReceiveTimestamp"] = strconv.FormatInt(m.firstRecv.UnixMilli(), 10)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

type deleteInput struct {
	QueueURL      string `json:"QueueUrl"`
	ReceiptHandle string `json:"ReceiptHandle"`
}

func (s *Server) deleteMessage(_ *http.Request, in *deleteInput) (any, *apiError) {
	if !strings.HasPrefix(in.ReceiptHandle, "AQEB") {
		return nil, &apiError{code: "ReceiptHandleIsInvalid", message: fmt.Sprintf("The input receipt handle \"%s\" is not a valid receipt handle.", in.ReceiptHandle)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, e := s.queueLocked(in.QueueURL)
	if e != nil {
		return nil, e
	}
	// A stale handle (the message was received again since) succeeds
	// without deleting, as SQS documents.
	q.msgs = slices.DeleteFunc(q.msgs, func(m *message) bool { return m.handle == in.ReceiptHandle })
	return map[string]any{}, nil
}

package streamlab;

import java.io.BufferedOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.channels.Channels;

import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.IpcOption;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.python.PythonSQLUtils;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.SQLExecution$;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils$;
import scala.collection.immutable.ArraySeq;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction0;

/**
 * A batch through a kept analysed plan as one Spark job, in one call: streamlab's
 * cluster/operators/spark_plans.py calls {@link #run} through py4j for every batch of a chain whose
 * plan it keeps (BatchJobs.run).
 *
 * <p>The same steps in Python were some thirty py4j calls a batch: the Arrow file read into a
 * DataFrame, the kept plan copied over the batch's relation node by node, the job's Arrow served
 * over a socket of its own (three calls to learn its port, secret and server, one for the
 * result), and a call to release each Java object the batch reached. Each is a round trip into the
 * JVM, up to a millisecond on a TaskManager whose two cores are busy, paid by every batch however
 * few its rows. The job and its Arrow are PySpark's own (Dataset.toArrowBatchRdd, under a SQL
 * execution as collectAsArrowToPython runs it), written to a file the caller reads whole.
 */
public final class BatchJob {
    private BatchJob() {}

    /**
     * The rows of the Arrow stream file {@code in} (of the Spark schema {@code schemaJson}) through
     * {@code template}, an analysed plan that reads one input relation (a LogicalRDD, the batch's
     * place) besides constants, written to {@code out} as an Arrow stream, partitions in order.
     * Returns the nanoseconds taken to bind the plan to the batch (the rest of the call is the job
     * and its output).
     */
    public static long run(SparkSession session, LogicalPlan template, String schemaJson, String in, String out)
            throws IOException {
        long started = System.nanoTime();
        Dataset<Row> batch = (Dataset<Row>) PythonSQLUtils.toDataFrame(
            PythonSQLUtils.readArrowStreamFromFile(in), schemaJson, session);
        RDD<InternalRow> rdd = ((LogicalRDD) batch.logicalPlan()).rdd();
        LogicalPlan plan = over(template, rdd);
        plan.setAnalyzed();
        Dataset<Row> result = Dataset.ofRows(session, plan);
        long bound = System.nanoTime();

        SQLConf conf = session.sessionState().conf();
        String timeZone = conf.sessionLocalTimeZone();
        boolean largeVarTypes = conf.arrowUseLargeVarTypes();
        boolean errorOnDuplicates = "legacy".equals(conf.pandasStructHandlingMode());
        byte[][] batches = SQLExecution$.MODULE$.withNewExecutionId(
            result.queryExecution(), scala.Option.apply("streamlab batch"), new AbstractFunction0<byte[][]>() {
                @Override
                public byte[][] apply() {
                    return (byte[][]) result.toArrowBatchRdd(
                        conf.arrowMaxRecordsPerBatch(), timeZone, errorOnDuplicates, largeVarTypes).collect();
                }
            });
        writeStream(out, result.schema(), timeZone, errorOnDuplicates, largeVarTypes,
                    scala.jdk.javaapi.CollectionConverters.asScala(java.util.Arrays.asList(batches).iterator()));
        return bound - started;
    }

    /** The plan with its LogicalRDD leaf (there is one) replaced by a copy that reads {@code rdd}. */
    private static LogicalPlan over(LogicalPlan node, RDD<InternalRow> rdd) {
        if (node instanceof LogicalRDD) {
            // the copy keeps the leaf's attribute ids, which every expression above refers to
            Object[] args = new Object[node.productArity()];
            for (int i = 0; i < args.length; i++) {
                args[i] = "rdd".equals(node.productElementName(i)) ? rdd : node.productElement(i);
            }
            return node.makeCopy(args);
        }
        Seq<LogicalPlan> children = node.children();
        if (children.isEmpty()) {
            return node;
        }
        LogicalPlan[] kids = new LogicalPlan[children.size()];
        boolean changed = false;
        for (int i = 0; i < kids.length; i++) {
            LogicalPlan child = children.apply(i);
            kids[i] = over(child, rdd);
            changed |= kids[i] != child;
        }
        return changed ? node.withNewChildren(seq(kids)) : node;
    }

    /** Arrow IPC messages of ArrowConverters (one encapsulated record batch each) as a stream file. */
    static void writeStream(String path, StructType schema, String timeZone, boolean errorOnDuplicates,
                            boolean largeVarTypes, scala.collection.Iterator<byte[]> batches) throws IOException {
        try (OutputStream file = new BufferedOutputStream(new FileOutputStream(path), 1 << 16)) {
            WriteChannel channel = new WriteChannel(Channels.newChannel(file));
            MessageSerializer.serialize(channel, ArrowUtils$.MODULE$.toArrowSchema(
                schema, timeZone, errorOnDuplicates, largeVarTypes, ArrowUtils$.MODULE$.toArrowSchema$default$5()));
            while (batches.hasNext()) {
                channel.write(batches.next());
            }
            ArrowStreamWriter.writeEndOfStream(channel, IpcOption.DEFAULT);
        }
    }

    @SuppressWarnings("unchecked")
    static <T> Seq<T> seq(T[] items) {
        return (Seq<T>) (Object) ArraySeq.unsafeWrapArray(items);
    }
}
